"""Non-finite guards: a NaN loss or an infinite gradient norm skips that optimizer step (the
parameters and Adam's moments stay as they were), is counted in ``train/nonfinite_steps`` and
training goes on; ``max_nonfinite_steps`` of them in a row stop the run with a message that says
what went wrong. Faults are injected into tiny CPU fits by patching `IBPOModule` and `PolicyUpdate`.

The tiny random model almost never earns a math reward, so every advantage would be 0 and no
forward pass would run; `IBPOModule.score` is replaced by the parity of a CRC of each response
(mixed rewards in every group, no reward worker processes)."""
from __future__ import annotations

import copy
import glob
import os
import sys
import zlib

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ibpo_lit.__main__ import entry_point, main
from ibpo_lit.module import IBPOModule
from ibpo_lit.training.update import NonFiniteError, PolicyUpdate

TINY = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.yaml")


@pytest.fixture(autouse=True)
def _plain_argv_and_mixed_rewards(monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # LightningCLI warns about pytest's own arguments
    monkeypatch.setattr(
        IBPOModule, "score",
        lambda self, texts, prompts: torch.tensor([float(zlib.crc32(t.encode()) % 2) for t in texts]),
    )


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")  # (tests/conftest.py)


def _args(root, steps: int, *overrides: str) -> list[str]:
    return ["fit", "--config", TINY, "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root),
            "--trainer.enable_progress_bar", "false", *overrides]


def _scalars(root) -> dict[str, dict[int, float]]:
    (events,) = glob.glob(os.path.join(str(root), "lightning_logs", "version_0", "events.out.tfevents.*"))
    acc = EventAccumulator(events, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _watch_updates(monkeypatch) -> dict[int, dict]:
    """Snapshot parameters and optimizer state before and after each rollout step's update."""
    seen: dict[int, dict] = {}
    original = PolicyUpdate.run

    def spy(self, update, optimizer, scheduler, step_index):
        before = (copy.deepcopy(self.policy.state_dict()), copy.deepcopy(optimizer.optimizer.state_dict()))
        out = original(self, update, optimizer, scheduler, step_index)
        after = (copy.deepcopy(self.policy.state_dict()), copy.deepcopy(optimizer.optimizer.state_dict()))
        seen[step_index] = {"before": before, "after": after}
        return out

    monkeypatch.setattr(PolicyUpdate, "run", spy)
    return seen


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _nan_loss_once(monkeypatch) -> dict:
    """The losses of the first rollout step >= 1 that runs a forward pass become NaN (so its
    backward gives NaN gradients)."""
    hit: dict = {}
    original = PolicyUpdate.policy_loss

    def patched(self, *args, **kwargs):
        loss, metrics = original(self, *args, **kwargs)
        if self.step_index >= 1 and hit.get("step", self.step_index) == self.step_index:
            hit["step"] = self.step_index
            loss = loss * float("nan")
        return loss, metrics

    monkeypatch.setattr(PolicyUpdate, "policy_loss", patched)
    return hit


def _inf_grad_once(monkeypatch) -> dict:
    """At rollout step 1 one gradient entry becomes +inf before clipping (a finite loss)."""
    hit: dict = {}
    original = PolicyUpdate.clip_and_check

    def patched(self):
        if self.step_index == 1 and not hit:
            p = next(p for p in self.policy.parameters() if p.requires_grad)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.view(-1)[0] = float("inf")
            hit["step"] = 1
        return original(self)

    monkeypatch.setattr(PolicyUpdate, "clip_and_check", patched)
    return hit


@pytest.mark.slow
@pytest.mark.parametrize("inject", [_nan_loss_once, _inf_grad_once], ids=["nan-loss", "inf-grad"])
def test_a_nonfinite_step_is_skipped_counted_and_training_goes_on(tmp_path, monkeypatch, inject):
    updates = _watch_updates(monkeypatch)
    hit = inject(monkeypatch)
    cli = main(_args(tmp_path, 3))
    assert "step" in hit, "the fault was never injected (no forward pass after step 0)"
    bad = hit["step"]

    assert cli.trainer.global_step == 3  # the skipped step still counts as a step
    assert cli.model.updater.nonfinite_total == 1
    before, after = updates[bad]["before"], updates[bad]["after"]
    assert _same(before[0], after[0]), "parameters changed on a skipped step"
    assert _same(before[1]["state"], after[1]["state"]), "Adam's moments changed on a skipped step"
    assert any(not _same(u["before"][0], u["after"][0]) for s, u in updates.items() if s > bad), \
        "no parameter moved after the skipped step: training did not go on"

    logged = _scalars(tmp_path)
    counts = logged["train/nonfinite_steps"]
    assert [counts[s] for s in sorted(counts)] == [float(s >= bad) for s in range(3)]
    # the steps around the skipped one logged finite losses
    assert all(torch.isfinite(torch.tensor(v)) for s, v in logged["train/loss"].items() if s != bad)


def _always_nonfinite(monkeypatch) -> None:
    monkeypatch.setattr(PolicyUpdate, "clip_and_check", lambda self: float("nan"))


@pytest.mark.slow
def test_a_run_of_nonfinite_steps_stops_with_a_message(tmp_path, monkeypatch):
    _always_nonfinite(monkeypatch)
    with pytest.raises(NonFiniteError, match=r"2 consecutive optimizer steps had a non-finite loss .* gradient norm"):
        main(_args(tmp_path, 5, "--model.max_nonfinite_steps", "2"))


@pytest.mark.slow
def test_the_command_line_reports_it_as_one_line(tmp_path, monkeypatch, capsys):
    _always_nonfinite(monkeypatch)
    assert entry_point(_args(tmp_path, 5, "--model.max_nonfinite_steps", "2")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ibpo-lit: error: 2 consecutive optimizer steps had a non-finite")
    assert "Lower optim.lr" in err[-1]
    assert not any("Traceback" in line for line in err)
