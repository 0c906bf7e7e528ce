"""The paper-scale configs (METHOD section 7) parse, name the strategy, devices and engine the
paper used, and instantiate with a tiny model in place of Qwen3 (no GPU, no download)."""
import os
import sys
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.strategies import FSDPStrategy

from ibpo_lit.__main__ import IBPOCLI, main

ROOT = os.path.join(os.path.dirname(__file__), "..")


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


def instantiate(monkeypatch, name, *overrides):
    """Everything the config names, instantiated; the Trainer itself (which would refuse FSDP
    without a GPU) is replaced by a record of its arguments and the strategy object."""
    seen = {}

    def record_trainer(self, **kwargs):
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        seen["trainer"] = dict(config["trainer"])
        return SimpleNamespace(**seen["trainer"])  # what the config checks read

    monkeypatch.setattr(IBPOCLI, "instantiate_trainer", record_trainer)
    cli = main(["--config", os.path.join(ROOT, "configs", name), "--model.model", "tiny-qwen3",
                "--data.train_path", "null", *overrides], run=False)
    return cli, seen["trainer"]


@pytest.mark.parametrize(
    "name, nodes, tp, context, layer",
    [
        ("qwen3_32b.yaml", 4, 4, 32768, "Qwen3DecoderLayer"),
        ("qwen3_next_80b.yaml", 4, 8, 262144, "Qwen3NextDecoderLayer"),
    ],
)
def test_paper_config(monkeypatch, name, nodes, tp, context, layer):
    cli, trainer = instantiate(monkeypatch, name)
    assert trainer["accelerator"] == "gpu" and trainer["devices"] == 8 and trainer["num_nodes"] == nodes
    assert trainer["precision"] == "bf16-mixed"
    strategy = trainer["strategy"]
    assert isinstance(strategy, FSDPStrategy)
    assert {cls.__name__ for cls in strategy.kwargs["auto_wrap_policy"]._module_classes} == {layer}
    checkpointed = strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes
    assert {cls.__name__ for cls in checkpointed} == {layer}
    assert strategy.kwargs["use_orig_params"] is True  # the weight sync reads parameters by name
    module = cli.model
    assert module.rollout_cfg.group_size == 8 and module.rollout_cfg.backend == "vllm"
    vllm = module.rollout_cfg.vllm
    assert vllm.tensor_parallel_size == tp and vllm.max_model_len == context and vllm.dtype == "bfloat16"
    assert module.rollout_cfg.sampling.max_new_tokens + cli.datamodule.max_prompt_tokens == context
    assert module.optim_cfg.lr == 5e-7 and module.optim_cfg.warmup_ratio == 0.03 and module.optim_cfg.min_lr_ratio == 0.1
    assert module.algorithm.loss == "gspo" and module.algorithm.ibpo == "plain"
    # the tiny model stands in for Qwen3: the module builds it and computes a loss
    module.rollout_cfg.backend = "hf"  # (vLLM tensor parallelism needs GPUs)
    module.configure_model()
    assert module.policy.config.model_type == "qwen3"


def test_swapping_the_strategy_is_a_config_change(monkeypatch):
    """The same file on one CPU process: only trainer.* overrides change."""
    _, trainer = instantiate(
        monkeypatch, "qwen3_32b.yaml",
        "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.num_nodes", "1",
    )
    assert trainer["strategy"] == "ddp" and str(trainer["devices"]) == "2"
