"""CorrectionMetrics: hand-derived values on a made-up step, and the logged covariance on
real steps of the tiny model against the formula on the step's own tensors."""
from __future__ import annotations

import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from callbacks.correction_metrics import CorrectionMetrics
from ibpo_lit.__main__ import main

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")
STEPS = 3
NAN = math.nan


def fake_step(rewards, delta, corr_rewards=None, distance=None):
    corrections = None
    if corr_rewards is not None:
        corrections = SimpleNamespace(rewards=torch.tensor(corr_rewards), distance=torch.tensor(distance))
    return SimpleNamespace(rewards=torch.tensor(rewards), delta=torch.tensor(delta), corrections=corrections)


def test_step_metrics_by_hand():
    cb = CorrectionMetrics()
    # rewards [1, 0, 0, 1], delta [0, .5, 0, 0]: cov = -.125 (see test_diagnostics); 1 of 4 shaped.
    # Rows 1 and 2 were corrected (finite distance); row 1's correction succeeded.
    out = cb.step_metrics(fake_step([1.0, 0.0, 0.0, 1.0], [0.0, 0.5, 0.0, 0.0],
                                    [NAN, 1.0, 0.0, NAN], [NAN, 0.2, 0.9, NAN]))
    assert out == pytest.approx({"ibpo/cov_y_phi": -0.125, "ibpo/shaped_frac": 0.25,
                                 "ibpo/correction_success_cum": 0.5, "ibpo/corrections_cum": 2.0})
    # Next step: 3 corrected rows, one success, one unscorable (NaN reward, finite distance):
    # running total 2 / 5.
    out = cb.step_metrics(fake_step([0.0, 0.0, 0.0, 1.0], [0.5, 0.0, 0.0, 0.0],
                                    [1.0, NAN, 0.0, NAN], [0.1, 0.4, 0.3, NAN]))
    assert out["ibpo/correction_success_cum"] == pytest.approx(2 / 5) and out["ibpo/corrections_cum"] == 5.0
    restored = CorrectionMetrics()
    restored.load_state_dict(cb.state_dict())
    assert (restored.attempted, restored.successful) == (5, 2)


def test_no_corrections_no_running_total():
    out = CorrectionMetrics().step_metrics(fake_step([1.0, 0.0], [0.0, 0.0]))
    assert out == {"ibpo/cov_y_phi": 0.0, "ibpo/shaped_frac": 0.0}


class ForceSomeCorrect(Callback):
    """Before CorrectionRollouts: a random tiny model rarely answers right, so the first
    rollout of each group is marked correct; Y then varies and so can Cov(Y, phi)."""

    def on_rollouts_scored(self, trainer, pl_module, step):
        first = torch.ones_like(step.rollouts.group_index, dtype=torch.bool)
        first[1:] = step.rollouts.group_index[1:] != step.rollouts.group_index[:-1]
        step.rewards[first.cpu()] = 1.0


class ForceSuccess(Callback):
    """After CorrectionRollouts: a random tiny model rarely corrects anything, so the first
    corrected row of each step is marked a successful local correction; the module then
    shapes it (Delta = beta) and the covariance is not trivially 0."""

    def on_rollouts_scored(self, trainer, pl_module, step):
        c = step.corrections
        corrected = (~c.distance.isnan()).nonzero().flatten()
        if len(corrected):
            c.rewards[corrected[0]], c.rewrite[corrected[0]] = 1.0, False


class Spy(Callback):
    """After CorrectionMetrics: what it logged, beside the step's tensors."""

    def __init__(self):
        self.seen = []

    def on_before_update(self, trainer, pl_module, step):
        logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("ibpo/")}
        self.seen.append((step.rewards.clone(), step.delta.clone(), step.corrections, logged))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    sys.argv = sys.argv[:1]
    cli = main(["--config", TINY, "--trainer.max_steps", str(STEPS),
                "--trainer.default_root_dir", str(tmp_path_factory.mktemp("cmetrics")),
                "--trainer.enable_progress_bar", "false", "--model.rollout.sampling.max_new_tokens", "8"],
               run=False)
    spy = Spy()
    cli.trainer.callbacks.insert(0, ForceSomeCorrect())
    cli.trainer.callbacks += [ForceSuccess(), CorrectionMetrics(), spy]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli, spy.seen


def test_logged_covariance_matches_the_formula_on_the_step(run):
    _, seen = run
    assert len(seen) == STEPS
    attempted = successful = shaped = 0
    for rewards, delta, corrections, logged in seen:
        keep = ~rewards.isnan()
        y, phi = 2 * rewards[keep].double() - 1, delta[keep].double()
        cov = ((y - y.mean()) * (phi - phi.mean())).mean().item()
        assert logged["ibpo/cov_y_phi"] == pytest.approx(cov, abs=1e-7)
        assert cov <= 0  # plain IBPO only shapes wrong rollouts (Y = -1): Assumption A.1 holds
        shaped += int(cov < 0)
        assert logged["ibpo/shaped_frac"] == pytest.approx((delta > 0).float().mean().item())
        attempted += int((~corrections.distance.isnan()).sum())
        successful += int((corrections.rewards == 1).sum())
        assert logged["ibpo/correction_success_cum"] == pytest.approx(successful / attempted)
    assert attempted > 0 and shaped > 0, "the test exercised nothing"
