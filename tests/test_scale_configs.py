"""The GPU configs (the paper's 32-GPU runs, one GPU, one 8-GPU node) parse, name the strategy,
devices and engine they promise, pass the config checks with their real models' context, and
instantiate with a tiny model in place of Qwen (no GPU, no download). The same code runs on two
CPU processes in tests/scale/."""
import os
import sys
from types import SimpleNamespace

import pytest

from ibpo_lit.__main__ import IBPOCLI, main
from ibpo_lit.scale import FSDP2Strategy

ROOT = os.path.join(os.path.dirname(__file__), "..")
@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    # (the real models' contexts come from their configs: ibpo_lit.models.known_configs offline)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


def instantiate(monkeypatch, name, *overrides, model=None):
    """Everything the config names, instantiated; the Trainer itself (which would need GPUs) is
    replaced by a record of its arguments."""
    seen = {}

    def record_trainer(self, **kwargs):
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        seen["trainer"] = dict(config["trainer"])
        trainer = SimpleNamespace(**seen["trainer"])  # what the config checks read
        trainer.num_devices = seen["trainer"]["devices"]
        return trainer

    monkeypatch.setattr(IBPOCLI, "instantiate_trainer", record_trainer)
    args = ["--config", os.path.join(ROOT, "configs", name), "--data.train_path", "null", "--data.val_path", "null"]
    if model is not None:
        args += ["--model.model", model]
    cli = main([*args, *overrides], run=False)
    return cli, seen["trainer"]


@pytest.mark.parametrize(
    "name, nodes, tp, context, engine_context",
    [("qwen3_32b.yaml", 4, 4, 32768, 40960), ("qwen3_next_80b.yaml", 4, 8, 262144, 262144)],
)
def test_paper_config(monkeypatch, name, nodes, tp, context, engine_context):
    # the real model name: its context is checked, and the config's plan (80 GB GPUs for 32B,
    # 141 GB for 80B) passes (the checks run the plan, as `fit` on the GPUs would)
    cli, trainer = instantiate(monkeypatch, name)
    assert trainer["accelerator"] == "gpu" and trainer["devices"] == 8 and trainer["num_nodes"] == nodes
    assert trainer["precision"] == "bf16-mixed"
    strategy = trainer["strategy"]
    assert isinstance(strategy, FSDP2Strategy) and strategy._save_distributed_checkpoint
    module = cli.model
    assert module.gradient_checkpointing and module.logprob_chunk_tokens
    assert module.rollout_cfg.group_size == 8 and module.rollout_cfg.backend == "vllm"
    vllm = module.rollout_cfg.vllm
    assert vllm.tensor_parallel_size == tp and vllm.max_model_len == engine_context and vllm.dtype == "bfloat16"
    assert (8 * nodes) % tp == 0
    assert module.rollout_cfg.sampling.max_new_tokens + cli.datamodule.max_prompt_tokens == context  # the paper's
    assert module.optim_cfg.lr == 5e-7 and module.optim_cfg.warmup_ratio == 0.03 and module.optim_cfg.min_lr_ratio == 0.1
    assert module.algorithm.loss == "gspo" and module.algorithm.ibpo.variant == "plain"


@pytest.mark.parametrize("name, devices, strategy_type", [
    ("qwen2p5_1p5b_gsm8k_1gpu.yaml", 1, str), ("qwen3_8b_8gpu.yaml", 8, FSDP2Strategy)])
def test_single_gpu_and_single_node_configs(monkeypatch, name, devices, strategy_type):
    cli, trainer = instantiate(monkeypatch, name)
    assert trainer["devices"] == devices and trainer.get("num_nodes", 1) == 1
    assert isinstance(trainer.get("strategy", "auto"), strategy_type)
    module = cli.model
    assert module.rollout_cfg.backend == "vllm" and module.rollout_cfg.vllm.enable_sleep_mode
    assert devices % module.rollout_cfg.vllm.tensor_parallel_size == 0
    assert module.rollout_cfg.sampling.max_new_tokens + cli.datamodule.max_prompt_tokens <= module.rollout_cfg.vllm.max_model_len
    if module.val_samples > 1:  # asks for validation samples: validates, at an interval in steps
        assert isinstance(trainer["val_check_interval"], int) and trainer["check_val_every_n_epoch"] is None


def test_a_context_longer_than_the_model_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="exceeds the model's context of 40960"):
        instantiate(monkeypatch, "qwen3_32b.yaml", "--model.rollout.sampling.max_new_tokens", "40000")


def test_the_tiny_model_builds_under_the_paper_config(monkeypatch):
    cli, _ = instantiate(monkeypatch, "qwen3_32b.yaml", "--data.max_prompt_tokens", "256",
                         "--model.rollout.sampling.max_new_tokens", "256", "--model.rollout.vllm.max_model_len", "1024",
                         "--model.algorithm.ibpo.max_new_tokens", "64",
                         model="tiny-qwen3")
    module = cli.model
    module.rollout_cfg.backend = "hf"  # (vLLM tensor parallelism needs its processes; tests/scale/ runs it)
    module.configure_model()
    assert module.policy.config.model_type == "qwen3"
    assert module.policy.is_gradient_checkpointing


def test_swapping_the_strategy_is_a_config_change(monkeypatch):
    """The same file on two CPU processes: only trainer.* overrides change."""
    _, trainer = instantiate(
        monkeypatch, "qwen3_32b.yaml",
        "--trainer.strategy", "fsdp2", "--trainer.accelerator", "cpu", "--trainer.devices", "4", "--trainer.num_nodes", "1",
    )
    assert trainer["strategy"] == "fsdp2" and str(trainer["devices"]) == "4"
