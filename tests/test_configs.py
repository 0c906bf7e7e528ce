"""Every shipped config parses and instantiates; bad configs fail before any model loads,
naming the field."""
import glob
import os
import sys

import pytest

from ibpo_lit.__main__ import main

CONFIGS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "configs", "*.yaml")))
# Configs for GPU clusters cannot build their Trainer here: tests/test_scale_configs.py covers them.
GPU_CONFIGS = ("qwen3_32b.yaml", "qwen3_next_80b.yaml", "qwen2p5_1p5b_gsm8k_1gpu.yaml", "qwen3_8b_8gpu.yaml")
CPU_CONFIGS = [c for c in CONFIGS if os.path.basename(c) not in GPU_CONFIGS]
TINY = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.yaml")


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


def test_there_are_configs():
    assert any(c.endswith("tiny.yaml") for c in CONFIGS)


@pytest.mark.parametrize("path", CPU_CONFIGS, ids=os.path.basename)
def test_config_parses_and_instantiates_without_loading_a_model(path, tmp_path, shared_data):
    extra = []
    if "mbpp" in os.path.basename(path):  # its data is the user's file: use the workspace's copy
        extra = ["--data.train_path", str(shared_data("mbpp_full.jsonl"))]
    cli = main(["--config", path, "--trainer.default_root_dir", str(tmp_path), *extra], run=False)
    assert cli.model.policy is None  # weights load in configure_model, at fit time
    assert cli.datamodule.tokenizer_name == cli.model.model_name  # linked
    dirpaths = [getattr(cb, "dirpath", None) for cb in cli.trainer.callbacks]
    assert os.path.join(str(tmp_path), "checkpoints") in dirpaths


@pytest.mark.parametrize(
    "override, message",
    [
        (["--model.algorithm.loss", "gspoo"], "unknown policy loss 'gspoo'; valid: grpo, gspo"),
        (["--model.algorithm.ibpo.variant", "maybe"], "valid: mask, none, plain, ratio"),
        (["--model.algorithm.agg_mode", "token-mean"], "agg_mode='token-mean' contradicts algorithm.loss='gspo'"),
        (["--model.algorithm.ibpo.lam", "2.5"], "lam"),
        (["--model.rollout.group_size", "1"], "rollout.group_size must be >= 2"),
        (["--model.rollout.sampling.top_p", "1.5"], "sampling.top_p"),
        (["--model.optim.lr", "0"], "optim.lr"),
        (["--model.reward", "poetry"], "poetry"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(override, message, tmp_path):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("'", "'")):
        main(["--config", TINY, "--trainer.default_root_dir", str(tmp_path), *override], run=False)


def test_unknown_key_is_rejected_naming_it(tmp_path):
    from ibpo_lit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.rollout.group_sise is not a setting \(did you mean model.rollout.group_size\?\)"):
        main(["--config", TINY, "--model.rollout.group_sise", "3"], run=False)
