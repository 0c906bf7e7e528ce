"""What one training step knows after its rollouts are scored.

The module builds a ``ScoredRollouts`` and hands it to every callback that defines
``on_rollouts_scored(trainer, pl_module, step)`` (see ``IBPOModule.training_step``); the
correction callback fills ``step.corrections`` there. Once rewards are shaped and advantages
computed, callbacks that define ``on_before_update(trainer, pl_module, step)`` see the
finished step (gradient-variance and correction metrics read it there). Shapes: ``P`` prompts, ``B = P * G``
responses, ``Lr`` padded response length, ``C`` correction samples.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from torch import Tensor

from ibpo_lit.data.prompt import Prompt
from ibpo_lit.rollout.batch import RolloutBatch


@dataclass
class StepStats:
    """One step's compute: the tokens each kind of pass processed, and the step's seconds.

    Written by the step's parts (`ibpo_lit.training.step_metrics.step_metrics`: rollouts and
    corrections; `PolicyUpdate`: the trainer's forwards with and without gradient; the module:
    CIW's masked forwards), read by ``callbacks.ComputeBudgetStopper`` and the benchmarks.
    """

    prompt_tokens: int = 0  # the rollouts' prompts (prefilled by the engine)
    generated_tokens: int = 0  # the rollouts' responses
    correction_prompt_tokens: int = 0
    correction_tokens: int = 0  # generated corrections
    trained_tokens: int = 0  # prompt + response tokens of every forward with gradient
    no_grad_tokens: int = 0  # ... and without (pi_old, the mismatch probe, CIW)
    step_seconds: Optional[float] = None  # None until the step's rollouts are scored

    def reset(self) -> None:
        """Every count back to its start, for a new step: in place, because the update's
        `UpdateRuntime` holds this object for the whole fit."""
        for f in fields(self):
            setattr(self, f.name, f.default)


@dataclass
class Corrections:
    """Compare-and-correct outcomes for the rows of a step (METHOD section 5)."""

    rewards: Tensor  # [B] float, r(x, y^) of the correction used for shaping; NaN where the
    #                  row got no correction (correct rows) or the correction was unscorable
    rewrite: Tensor  # [B] bool, the correction is a full rewrite (earns no shaping)
    kept_mask: Tensor  # [B, Lr] bool, positions of y_i the correction kept unchanged
    distance: Tensor  # [B] float, d(y_i, y^); NaN where no correction
    alpha: float  # rewrite threshold used for this step (fixed or adaptive)
    train_batch: RolloutBatch | None = None  # [C, ...] correction samples to train jointly
    train_rewards: Tensor | None = None  # [C] float, their rewards (NaN = unscorable)
    train_source: Tensor | None = None  # [C] long, the row (wrong rollout) each sample corrects
    generated_tokens: int = 0  # tokens the correction rollouts generated (compute accounting)
    prompt_tokens: int = 0  # tokens of the correction prompts (prefilled once per sample)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class UpdateBatch:
    """What the updates train on: the rollouts, plus the correction samples when trained jointly."""

    batch: RolloutBatch  # N = B (+ C) rows
    advantages: Tensor  # [N] float, or [N, Lr'] with a token-level estimator (REINFORCE++)
    token_weights: Tensor | None  # [N, Lr'] float, None = all ones


@dataclass
class ScoredRollouts:
    prompts: list[Prompt]  # P prompts of this step
    rollouts: RolloutBatch  # B = P * G responses, prompt-major
    texts: list[str]  # B decoded responses
    rewards: Tensor  # [B] float, 1/0 from the verifier, NaN = unscorable
    step: int  # rollout step index (0-based), the seed base for everything sampled here
    corrections: Corrections | None = None  # filled by the correction callback
    # Filled by the module before ``on_before_update`` hooks run:
    shaped_rewards: Tensor | None = None  # [B] r + lambda * Delta (= rewards without IBPO)
    delta: Tensor | None = None  # [B] Delta_i, the IBPO shaping term (0 without IBPO)
    update: UpdateBatch | None = None
    # The weights version the rollouts were sampled with (the engine's; ``training.off_policy``
    # checks the lag at the update). None: not recorded (the on-policy path: the current weights).
    weights_version: int | None = None
