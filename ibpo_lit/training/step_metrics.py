"""A step's clock and what it counts: timings, throughput, tokens for compute accounting."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ibpo_lit.training.step_types import ScoredRollouts, StepStats


@dataclass
class StepClock:
    """Wall-clock marks of one step, in order (``mark("generate")`` ends the generate phase)."""

    start: float = field(default_factory=time.perf_counter)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str) -> None:
        self.marks[phase] = time.perf_counter()

    def seconds(self) -> dict[str, float]:
        """Each phase's seconds (from the previous mark) and the whole step's."""
        out, last = {}, self.start
        for phase, at in self.marks.items():
            out[phase] = at - last
            last = at
        out["step"] = last - self.start
        return out


def step_metrics(step: ScoredRollouts, clock: StepClock, step_stats: StepStats) -> dict[str, float]:
    """Rollout shape, throughput and timing metrics; fills ``step_stats``'s token counts (what
    ``callbacks.ComputeBudgetStopper`` charges) with the step's prompts, generations, corrections."""
    rollouts, corrections = step.rollouts, step.corrections
    seconds = clock.seconds()
    correction_tokens = corrections.generated_tokens if corrections is not None else 0
    generated = int(rollouts.response_mask.sum())
    step_stats.prompt_tokens = int(rollouts.prompt_mask.sum())
    step_stats.generated_tokens = generated
    step_stats.correction_tokens = correction_tokens
    step_stats.correction_prompt_tokens = corrections.prompt_tokens if corrections is not None else 0
    step_stats.step_seconds = seconds["step"]
    return {
        "train/response_len": rollouts.response_lengths.float().mean().item(),
        "train/truncated_frac": 1.0 - rollouts.finished.float().mean().item(),
        "train/tokens_per_s": (generated + correction_tokens) / max(seconds["step"], 1e-9),
        **{f"timing/{phase}_s": s for phase, s in seconds.items()},
    }
