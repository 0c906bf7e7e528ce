"""IBPO's instrumentation from METHOD section 6 that the step itself does not log.

At ``on_before_update`` (rewards shaped, advantages known) it logs:

- ``ibpo/cov_y_phi``: ``Cov(Y, phi)`` with ``Y = 2r - 1`` and ``phi = Delta`` over the scored
  rollouts (``diagnostics.reward_shaping_covariance``); Assumption A.1 expects it < 0 at
  every step. Without shaping (``Delta = 0``) it is 0.
- ``ibpo/shaped_frac``: share of the step's rollouts with ``Delta > 0``.
- ``ibpo/correction_success_cum``: successful / attempted corrections over the whole run
  (saved in checkpoints, so a resumed run continues it), and ``ibpo/corrections_cum``, the
  attempted count.

"Attempted" counts the wrong rollouts that got a correction (finite ``d(y_i, y^)``),
"successful" those whose correction the verifier accepted (``r(x, y^) = 1``), whether or not
it was a full rewrite. With ``corrections_per_input > 1`` this is the first correction of each
wrong rollout (the one that decides shaping), so it may differ from the per-step
``train/correction_success`` of ``CorrectionRollouts``, which counts all ``k`` samples; that
callback also logs the per-step rewrite rate (``train/rewrite_rate``).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from ibpo_lit.algorithms.diagnostics import reward_shaping_covariance
from ibpo_lit.training.step_types import ScoredRollouts


class CorrectionMetrics(Callback):
    """Logs ``Cov(Y, phi)``, the shaped fraction and the run's cumulative correction success."""

    def __init__(self) -> None:
        self.attempted = 0
        self.successful = 0

    def on_before_update(self, trainer, pl_module, step: ScoredRollouts) -> None:
        metrics = self.step_metrics(step)
        for key, value in metrics.items():
            if math.isfinite(value):
                pl_module.log(key, value, on_step=True, on_epoch=False, batch_size=1)

    def step_metrics(self, step: ScoredRollouts) -> dict[str, float]:
        """Update the running totals with ``step`` and return the metrics to log."""
        out: dict[str, float] = {}
        if step.delta is not None:
            delta = step.delta.detach().float().cpu()
            out["ibpo/cov_y_phi"] = reward_shaping_covariance(step.rewards, delta)
            out["ibpo/shaped_frac"] = float((delta > 0).float().mean()) if delta.numel() else math.nan
        c = step.corrections
        if c is not None:
            self.attempted += int(torch.isfinite(c.distance).sum())
            self.successful += int((c.rewards == 1).sum())
        if self.attempted:
            out["ibpo/correction_success_cum"] = self.successful / self.attempted
            out["ibpo/corrections_cum"] = float(self.attempted)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"attempted": self.attempted, "successful": self.successful}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.attempted = int(state_dict.get("attempted", 0))
        self.successful = int(state_dict.get("successful", 0))
