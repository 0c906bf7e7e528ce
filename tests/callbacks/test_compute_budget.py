"""ComputeBudgetStopper: its arithmetic on real steps of the tiny model, an early stop at a
small budget, and a resumed run that continues the budget from the checkpoint."""
from __future__ import annotations

import dataclasses
import os
import sys

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from callbacks.compute_budget import ComputeBudgetStopper
from ibpo_lit.__main__ import main
from ibpo_lit.algorithms.diagnostics import estimate_flops

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")
FIRST_STEPS = 2
FAST = ["--model.rollout.sampling.max_new_tokens", "8"]  # short responses: cheap steps


class Recorder(Callback):
    """After the stopper: copies the step's stats and the stopper's totals each step."""

    def __init__(self, stopper):
        self.stopper = stopper
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("compute/")}
        self.rows.append(
            {"stats": dataclasses.asdict(pl_module.step_stats), "flops": self.stopper.flops,
             "seconds": self.stopper.device_seconds, "logged": logged}
        )


def build(root, steps: int, stopper: ComputeBudgetStopper):
    sys.argv = sys.argv[:1]
    cli = main(["--config", TINY, "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root),
                "--trainer.enable_progress_bar", "false", *FAST], run=False)
    # Before ModelCheckpoint (as Lightning orders configured callbacks), so a checkpoint
    # saved at a step holds that step's totals.
    at = next(i for i, cb in enumerate(cli.trainer.callbacks) if isinstance(cb, ModelCheckpoint))
    cli.trainer.callbacks.insert(at, stopper)
    recorder = Recorder(stopper)
    cli.trainer.callbacks.append(recorder)
    return cli, recorder


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    stopper = ComputeBudgetStopper()  # logging only
    cli, recorder = build(root, FIRST_STEPS, stopper)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return root, cli, stopper, recorder.rows


def test_arguments_are_validated():
    for bad in ({"max_flops": 0}, {"max_flops": -1.0}, {"max_device_seconds": float("inf")}, {"log_every": 0}):
        with pytest.raises(ValueError):
            ComputeBudgetStopper(**bad)
    ComputeBudgetStopper()  # no budget: logging only


def test_state_round_trips():
    a = ComputeBudgetStopper(max_flops=1e9)
    a.device_seconds, a.flops, a.generated_tokens, a.trained_tokens, a.steps = 12.5, 3e8, 40, 90, 3
    b = ComputeBudgetStopper(max_flops=2e9)  # budgets come from the config, not the checkpoint
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict() and b.max_flops == 2e9


def test_totals_follow_the_step_stats_and_grow(first_run):
    _, cli, stopper, rows = first_run
    assert cli.trainer.global_step == FIRST_STEPS and stopper.stop_reason is None
    n_params = sum(p.numel() for p in cli.model.policy.parameters())
    flops, seconds = 0.0, 0.0
    for row in rows:
        s = row["stats"]
        assert s["correction_tokens"] > 0 and s["correction_prompt_tokens"] > 0  # corrections are counted
        step_flops = estimate_flops(
            n_params,
            prompt_tokens=s["prompt_tokens"] + s["correction_prompt_tokens"],
            generated_tokens=s["generated_tokens"] + s["correction_tokens"],
            trained_tokens=s["trained_tokens"],
            no_grad_tokens=s["no_grad_tokens"],
        )["total"]
        flops += step_flops
        seconds += s["step_seconds"]  # one CPU device
        assert row["flops"] == pytest.approx(flops) and row["seconds"] == pytest.approx(seconds)
        assert row["logged"]["compute/step_flops"] == pytest.approx(step_flops, rel=1e-6)
        assert row["logged"]["compute/flops"] == pytest.approx(flops, rel=1e-6)
    logged_flops = [r["logged"]["compute/flops"] for r in rows]
    logged_seconds = [r["logged"]["compute/device_seconds"] for r in rows]
    assert all(b > a for a, b in zip(logged_flops, logged_flops[1:]))
    assert all(b > a for a, b in zip(logged_seconds, logged_seconds[1:]))
    assert stopper.steps == FIRST_STEPS


def test_a_small_budget_stops_the_run_early(first_run, tmp_path):
    _, _, _, rows = first_run
    # Same seeds, same tokens: the budget is spent exactly at the end of step 1.
    stopper = ComputeBudgetStopper(max_flops=rows[0]["flops"])
    cli, _ = build(tmp_path, 6, stopper)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 1 < 6
    assert stopper.stop_reason is not None and "max_flops" in stopper.stop_reason


def test_a_resumed_run_continues_the_budget(first_run, tmp_path):
    root, _, first, rows = first_run
    ckpt = os.path.join(str(root), "checkpoints", "last.ckpt")
    saved = torch.load(ckpt, weights_only=False)["callbacks"]["ComputeBudgetStopper"]
    assert saved == first.state_dict()
    # One FLOP of room: any resumed step spends it, but only if the totals were restored
    # (one step alone is far below the first run's total).
    budget = rows[-1]["flops"] + 1.0
    stopper = ComputeBudgetStopper(max_flops=budget)
    cli, recorder = build(tmp_path, 8, stopper)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt)
    assert cli.trainer.global_step == FIRST_STEPS + 1
    assert len(recorder.rows) == 1 and recorder.rows[0]["flops"] > rows[-1]["flops"]
    assert recorder.rows[0]["logged"]["compute/step_flops"] < rows[-1]["flops"]  # alone, under budget
    assert stopper.steps == FIRST_STEPS + 1


def test_a_resumed_run_with_its_budget_spent_does_not_step(first_run, tmp_path):
    root, _, _, rows = first_run
    stopper = ComputeBudgetStopper(max_flops=rows[-1]["flops"])
    cli, recorder = build(tmp_path, 8, stopper)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=os.path.join(str(root), "checkpoints", "last.ckpt"))
    assert cli.trainer.global_step == FIRST_STEPS and recorder.rows == []
    assert stopper.stop_reason is not None
