"""Numbers over seeds as table cells: the mean and its 95% Student's t interval
(``evaluation.bootstrap.t_interval``), per-seed ratios of one arm to a baseline arm (geometric
mean, t on the logs), and per-seed differences between two arms (paired t over the seeds both
ran; Welch's t when they share none).

Covered: missing values (None, NaN) are left out of a cell; a single value is shown without an
interval (one run has none); values that are all equal are shown as such, not as a zero-width
interval (no spread was seen, which with 3 seeds and 32 validation samples happens by chance and
is not certainty).
Not covered: pairing across comparisons; callers pass runs of one comparison (same budget).
Intervals are per cell, not simultaneous over a table (``tables.multiplicity_note``).
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

from ibpo_lit.evaluation.bootstrap import log_t_interval, paired_t_interval, t_interval, welch_interval

MIN_SEEDS = 3  # fewer seeds than this: the row is marked, its interval says little
ALL_EQUAL = "(all equal)"  # a cell whose seeds agree exactly: no interval to show


def finite(values: Iterable[float | None]) -> list[float]:
    """The values that are numbers (None and NaN left out)."""
    return [float(v) for v in values if v is not None and not math.isnan(v)]


def interval_text(mean: float, low: float, high: float, fmt: str,
                  bounds: tuple[float, float] | None = None) -> str:
    """``mean [low, high]``; the mean alone for NaN bounds (one value), ``mean (all equal)`` for
    a zero-width interval. ``bounds`` clip the interval to the values a quantity can take (a
    t-interval of a share near 0 reaches below it)."""
    if math.isnan(low):
        return fmt.format(mean)
    if low == high:
        return f"{fmt.format(mean)} {ALL_EQUAL}"
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return f"{fmt.format(mean)} [{fmt.format(low)}, {fmt.format(high)}]"


def ci_cell(values: Iterable[float | None], fmt: str, scale: float = 1.0,
            bounds: tuple[float, float] | None = None) -> str:
    """``mean [low, high]`` (95% t over the values) of ``values * scale`` formatted with ``fmt``,
    clipped to ``bounds``; ``-`` when none is a number."""
    xs = [v * scale for v in finite(values)]
    return interval_text(*t_interval(xs), fmt, bounds) if xs else "-"


def ratio_cell(ratios: Sequence[float], fmt: str) -> str:
    """Geometric mean of positive per-seed ratios and its 95% t-interval on the log scale."""
    return interval_text(*log_t_interval(ratios), fmt) if ratios else "-"


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


def paired_values(runs: Sequence[dict], baseline_runs: Sequence[dict],
                  value: Callable[[dict], float | None]) -> tuple[list[float], list[float]]:
    """``(a, b)``: ``value`` of each run and of the baseline's run at the same seed, for the
    seeds where both are numbers, in the order of ``runs``."""
    base = {r["seed"]: value(r) for r in baseline_runs}
    a, b = [], []
    for run in runs:
        x, y = value(run), base.get(run["seed"])
        if finite([x]) and finite([y]):
            a.append(float(x))
            b.append(float(y))
    return a, b


def difference_cell(runs: Sequence[dict], baseline_runs: Sequence[dict], value: Callable[[dict], float | None],
                    fmt: str, n_shown: int | None = None) -> str:
    """``value(arm) - value(baseline)``: paired t over the seeds both ran (2 or more); Welch's t
    when they share no seed; ``-`` otherwise. Marked ``*(n=k)*`` when the pairs are fewer than
    ``n_shown`` (the row's seeds), ``*(Welch)*`` when unpaired."""
    a, b = paired_values(runs, baseline_runs, value)
    if len(a) >= 2:
        text = interval_text(*paired_t_interval(a, b), fmt)
        return text + (f" *(n={len(a)})*" if n_shown is not None and len(a) < n_shown else "")
    shared = {r["seed"] for r in runs} & {r["seed"] for r in baseline_runs}
    xs, ys = finite(value(r) for r in runs), finite(value(r) for r in baseline_runs)
    if not shared and len(xs) >= 2 and len(ys) >= 2:
        return interval_text(*welch_interval(xs, ys), fmt) + " *(Welch)*"
    return "-"


def seeds_label(label: str, n: int) -> str:
    """``label``, marked with ``*(n=2)*`` when it has fewer than ``MIN_SEEDS`` seeds."""
    return f"{label} *(n={n})*" if n < MIN_SEEDS else label
