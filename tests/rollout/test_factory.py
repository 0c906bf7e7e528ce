"""``build_engine`` and ``ENGINES``: the one factory training and evaluation share. (Its vLLM path,
weights that exist only in memory synced into a config-only engine, runs in its own process:
tests/evaluation/test_vllm_backend.py; training's, in the vLLM fits.)"""
from typing import get_args

import pytest

from ibpo_lit.config import RolloutConfig
from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer
from ibpo_lit.rollout import HFRolloutEngine, SamplingConfig
from ibpo_lit.rollout.factory import ENGINES, Backend, build_engine


def test_the_command_line_names_are_the_registry_names():
    assert sorted(get_args(Backend)) == ENGINES.names() == ["hf", "vllm", "vllm_server"]


def test_hf_samples_from_the_policy_itself_with_the_training_settings():
    model, tokenizer = build_tiny_model(seed=0), build_tiny_tokenizer()
    sampling = SamplingConfig(max_new_tokens=5)
    engine = build_engine(model, tokenizer, sampling, "hf", reshard_after_forward=False)
    assert isinstance(engine, HFRolloutEngine)
    assert engine.model is model and engine.sampling is sampling
    assert engine.reshard_after_forward is False
    assert engine.eos_token_ids == [tokenizer.eos_token_id] and engine.pad_token_id == tokenizer.pad_token_id
    assert engine.context_limit is None  # the model's own limit only
    assert not ENGINES.get("hf").separate_weights and ENGINES.get("vllm").separate_weights


def test_an_unknown_backend_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown rollout backend 'sglang'; valid: hf, vllm, vllm_server"):
        build_engine(None, None, SamplingConfig(), "sglang")
    with pytest.raises(ValueError, match="rollout.backend must be one of hf, vllm, vllm_server, got 'sglang'"):
        RolloutConfig(backend="sglang")


def test_the_run_context_is_the_tighter_of_the_model_and_the_engine():
    from types import SimpleNamespace

    from ibpo_lit.module import IBPOModule

    module = IBPOModule()
    module.policy = build_tiny_model(seed=0)
    positions = module.policy.config.max_position_embeddings
    module.engine = build_engine(module.policy, build_tiny_tokenizer(), SamplingConfig(), "hf")
    assert module.context_limit == positions
    module.engine = SimpleNamespace(context_limit=positions - 1)  # a vLLM engine's max_model_len
    assert module.context_limit == positions - 1


def test_plain_tensor_defaults_undo_a_default_device_and_dtype():
    import torch

    from ibpo_lit.rollout.factory import plain_tensor_defaults

    with torch.device("meta"):
        torch.set_default_dtype(torch.float64)
        try:
            with plain_tensor_defaults():
                made = torch.zeros(2)
            after = torch.zeros(2)
        finally:
            torch.set_default_dtype(torch.float32)
    assert (made.device.type, made.dtype) == ("cpu", torch.float32)
    assert (after.device.type, after.dtype) == ("meta", torch.float64)  # the caller's context is back


def test_the_engine_is_built_outside_the_strategys_tensor_init_context(tmp_path, monkeypatch, one_intra_op_thread):
    """Lightning runs ``configure_model`` under ``strategy.tensor_init_context()``: on a GPU
    ``with torch.device("cuda:0")``, under which vLLM's pinned host buffers become CUDA tensors
    and raise. Here the strategy's context sets the default device to ``cpu:0`` (a CPU device
    that tells itself apart from the plain ``cpu``: a CUDA one cannot run here), a real fit runs
    Lightning's own ``configure_model`` path, and the engine records the default device it was
    built under: the plain one, while the policy is built under the strategy's."""
    from contextlib import contextmanager

    import lightning as L
    import torch
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from ibpo_lit.config import AlgorithmConfig, IBPOConfig
    from ibpo_lit.data.datamodule import PromptDataModule
    from ibpo_lit.module import IBPOModule
    from ibpo_lit.rollout import hf

    class MarkedDeviceStrategy(SingleDeviceStrategy):
        @contextmanager
        def tensor_init_context(self, empty_init=None):
            with super().tensor_init_context(empty_init), torch.device("cpu:0"):  # (Lightning's own: "cpu")
                yield

    seen = {}
    real_init = hf.HFRolloutEngine.__init__

    def recording_init(self, *args, **kwargs):
        seen["engine"] = torch.get_default_device()
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(hf.HFRolloutEngine, "__init__", recording_init)

    class Policy(IBPOModule):
        def _load_policy(self):
            seen["policy"] = torch.get_default_device()
            return super()._load_policy()

    trainer = L.Trainer(accelerator="cpu", strategy=MarkedDeviceStrategy(torch.device("cpu")), max_steps=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    module = Policy(model="tiny-llama", algorithm=AlgorithmConfig(ibpo=IBPOConfig(variant="none")))
    trainer.fit(module, PromptDataModule(tokenizer="tiny-llama", prompts_per_step=1))
    assert seen["policy"] == torch.device("cpu", 0)  # the strategy's context was in force ...
    assert seen["engine"] == torch.device("cpu")  # ... and the engine was built outside it
