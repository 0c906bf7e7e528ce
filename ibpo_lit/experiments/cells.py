"""Numbers over seeds as table cells: the mean and its 95% percentile-bootstrap CI
(``evaluation.bootstrap.bootstrap_ci``, seed 0, so a cell is reproducible), and per-seed
ratios of one arm to a baseline arm.

Covered: missing values (None, NaN) are left out of a cell; a single value is shown without an
interval (a one-point bootstrap interval is that point, and would read as certainty).
Not covered: pairing across comparisons; callers pass runs of one comparison (same budget).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

from ibpo_lit.evaluation.bootstrap import bootstrap_ci

MIN_SEEDS = 3  # fewer seeds than this: the row is marked, its interval says little


def finite(values: Iterable[float | None]) -> list[float]:
    """The values that are numbers (None and NaN left out)."""
    return [float(v) for v in values if v is not None and not math.isnan(v)]


def ci_cell(values: Iterable[float | None], fmt: str, scale: float = 1.0) -> str:
    """``mean [low, high]`` of ``values * scale`` formatted with ``fmt``; ``-`` when none
    is a number, the mean alone for a single value."""
    xs = [v * scale for v in finite(values)]
    if not xs:
        return "-"
    mean, low, high = bootstrap_ci(xs)
    if len(xs) == 1:
        return fmt.format(mean)
    return f"{fmt.format(mean)} [{fmt.format(low)}, {fmt.format(high)}]"


def paired_ratios(runs: Sequence[dict], baseline_runs: Sequence[dict], key: str) -> list[float]:
    """``run[key] / baseline[key]`` for each run whose seed the baseline also ran, in the
    order of ``runs``; a missing or zero value drops that seed."""
    base = {r["seed"]: r.get(key) for r in baseline_runs}
    out = []
    for run in runs:
        num, den = run.get(key), base.get(run["seed"])
        if finite([num]) and finite([den]) and den != 0:
            out.append(num / den)
    return out


def seeds_label(label: str, n: int) -> str:
    """``label``, marked with ``*(n=2)*`` when it has fewer than ``MIN_SEEDS`` seeds."""
    return f"{label} *(n={n})*" if n < MIN_SEEDS else label
