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
    assert sorted(get_args(Backend)) == ENGINES.names() == ["hf", "vllm"]


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
    with pytest.raises(ValueError, match="unknown rollout backend 'sglang'; valid: hf, vllm"):
        build_engine(None, None, SamplingConfig(), "sglang")
    with pytest.raises(ValueError, match="rollout.backend must be one of hf, vllm, got 'sglang'"):
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
