"""The update's memory plan fitted to measured peaks: two free constants, then a prediction.

The plan puts the update's peak on one GPU at ``state + max(backward, step)``
(`ibpo_lit.plan.memory.update_moments`): the trainer's persistent tensors (parameters,
gradients, AdamW's moments: measured within 5% on 2 CPU processes), the backward's transients
(FSDP2's gathered units, the activations, autocast's copies, the log-prob head's chunk) and the
optimizer step's temporary. What no CPU measures is how far a GPU's kernels depart from the
backward's formulas and what the allocator adds on top of them, so two constants are fitted to
the peaks ``torch.cuda.max_memory_allocated`` reports for a few update cases:

* ``activation_factor``: multiplies the backward's transients;
* ``reserve_gib``: a fixed amount beside them (workspaces of cuBLAS and cuDNN, the allocator's
  block rounding, small buffers).

``measured ~ state + max(activation_factor * backward, step) + reserve``: least squares over the
cases, ``activation_factor`` on a grid (the ``max`` makes it piecewise linear) and ``reserve``
in closed form for each. Where no case's backward outweighs its step, the factor is not
identified and stays 1 (the closest to 1 among equally good fits). With one case only the
reserve is fitted.

Not covered here: the CUDA context and the allocator's slack (reserved minus allocated), which
are outside ``max_memory_allocated``: `scripts/gpu_check.py` measures them directly and states
them beside the fit (together they are the plan's ``overhead_gib``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from ibpo_lit.plan.memory import GIB

FACTOR_GRID = [round(0.25 + 0.005 * i, 3) for i in range(751)]  # 0.25 .. 4.00
"""Activation factors tried: a GPU's transients between a quarter and four times the formulas'."""


@dataclass(frozen=True)
class UpdateCase:
    """One update's planned moments and its measured peak, all in bytes (``measured`` may be
    None: a case to predict)."""

    name: str
    state: float
    backward: float
    step: float
    measured: float | None = None


@dataclass(frozen=True)
class Calibration:
    activation_factor: float
    reserve_bytes: float
    cases: tuple[str, ...]  # the names of the cases it was fitted on
    worst_error: float  # the largest |predicted - measured| / measured among them

    def predict(self, case: UpdateCase) -> float:
        """The case's peak allocated bytes by the fitted constants."""
        return predict(case, self.activation_factor, self.reserve_bytes)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["reserve_gib"] = out.pop("reserve_bytes") / GIB
        out["cases"] = list(self.cases)
        return out


def predict(case: UpdateCase, activation_factor: float = 1.0, reserve_bytes: float = 0.0) -> float:
    """``state + max(activation_factor * backward, step) + reserve`` (bytes)."""
    return case.state + max(activation_factor * case.backward, case.step) + reserve_bytes


def fit(cases: Sequence[UpdateCase]) -> Calibration:
    """The constants that predict the measured ``cases`` best (least squares; see the module
    docstring). Raises ValueError without a measured case."""
    measured = [c for c in cases if c.measured is not None]
    if not measured:
        raise ValueError("calibration needs at least one case with a measured peak")
    grid = FACTOR_GRID if len(measured) > 1 else [1.0]
    fits = []
    for factor in grid:
        residual = [c.measured - predict(c, factor) for c in measured]
        reserve = sum(residual) / len(residual)
        fits.append((sum((r - reserve) ** 2 for r in residual), factor, reserve))
    # equally good fits (the peaks do not show the factor): the factor nearest 1
    scale = sum(c.measured for c in measured) / len(measured)
    least = min(sse for sse, _, _ in fits)
    _, factor, reserve = min((abs(f - 1.0), f, r) for sse, f, r in fits if sse <= least + 1e-12 * scale ** 2)
    worst = max(abs(predict(c, factor, reserve) - c.measured) / c.measured for c in measured)
    return Calibration(activation_factor=factor, reserve_bytes=reserve, cases=tuple(c.name for c in measured),
                       worst_error=worst)
