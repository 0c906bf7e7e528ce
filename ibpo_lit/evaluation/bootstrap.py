"""Confidence intervals across runs (seeds): Student's t, and the percentile bootstrap for
comparison.

What is covered:
- ``t_interval``: the mean of one number per run and ``mean +- t_{n-1} * sd / sqrt(n)`` (sd the
  sample standard deviation). With 3 to 5 seeds this is the interval to use: it assumes the
  per-seed values are roughly normal, and it widens with few seeds as it must (t_{2, 0.975} =
  4.30). The default of ``combine_runs`` and of every table over seeds.
- ``paired_t_interval``: the mean of ``a - b`` over seeds both arms ran (same seed: same
  problems, same validation set, same initial weights), with ``t_interval`` on the differences.
- ``welch_interval``: the difference of two means when the arms share no seeds (Welch's
  unequal-variance t, Satterthwaite's degrees of freedom).
- ``log_t_interval``: the geometric mean of positive ratios and ``t_interval`` on their logs,
  mapped back (a ratio's spread is multiplicative; a t-interval on raw ratios can go below 0).
- ``bootstrap_ci``: the percentile bootstrap of the mean, kept to show what it does with few
  seeds. With n values it cannot reach past the smallest and largest; with 3 the 2.5% and
  97.5% percentiles of the resample means *are* the smallest and largest (a resample of three
  copies of the minimum has probability 1/27 > 2.5%), and that "95%" interval covers the true
  mean about 75% of the time (``tests/evaluation/test_bootstrap.py`` simulates it).
- ``combine_runs``: several result JSONs of ``evaluate`` (same benchmark and k, different seeds)
  -> per metric the mean, the interval and the per-run values.

What is not covered:
- Simultaneous intervals. Every interval is for one comparison at a time; a table that compares
  many arms will hold some intervals that miss by chance (about 1 in 20 at 95%).
- Resampling problems within one run (that interval reflects the test set, not the seed).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

# Result fields that are combined across runs, in the order tables show them.
# Code runs add test_pass_frac (and have maj@k None); the baselines add best_of_n* and ttc*.
RUN_METRICS = (
    "avg@k", "pass@1", "pass@k", "maj@k", "test_pass_frac",
    "best_of_n", "best_of_n_majority",
    "ttc@1", "ttc_fixed", "ttc_broken", "ttc_oracle@1", "ttc_oracle_fixed", "ttc_oracle_broken",
    "response_len", "truncated_frac", "unscorable_frac",
)
# Fields that must agree between the runs being combined.
SAME_ACROSS_RUNS = ("benchmark", "k", "n_problems")
INTERVALS = ("t", "bootstrap")  # combine_runs' methods


def _values(values: Sequence[float]) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"values must be finite, got {x.tolist()}")
    return x


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def t_quantile(confidence: float, df: float) -> float:
    """The two-sided Student's t multiplier: ``t_{df, (1 + confidence) / 2}``."""
    from scipy import stats  # scipy.stats takes ~0.3 s to import: only where an interval is built

    return float(stats.t.ppf((1.0 + confidence) / 2.0, df))


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` and its Student's t confidence interval.

    Args:
        values: One number per run (e.g. avg@64 of each seed); at least one, all finite.
        confidence: Coverage of the interval, in (0, 1).

    Returns:
        ``(mean, low, high)``: ``mean -+ t_{n-1} * sd / sqrt(n)``. Identical values give
        ``low == high == mean`` (no spread was seen: the caller should say so rather than show a
        zero-width interval); a single value gives NaN bounds (one run has no interval).
    """
    _check_confidence(confidence)
    x = _values(values)
    if np.all(x == x[0]):  # the exact value, not a float-rounded mean of copies
        v = float(x[0])
        return (v, v, v) if x.size > 1 else (v, math.nan, math.nan)
    mean, n = float(x.mean()), x.size
    half = t_quantile(confidence, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def paired_t_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``a[i] - b[i]`` (runs paired by seed, in the same order) and its t-interval."""
    if len(a) != len(b):
        raise ValueError(f"paired values need as many of each, got {len(a)} and {len(b)}")
    return t_interval(_values(a) - _values(b), confidence)


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``mean(a) - mean(b)`` for runs that share no seeds, with Welch's t-interval (each side's
    own variance; Satterthwaite's degrees of freedom). Needs at least 2 values on each side."""
    _check_confidence(confidence)
    x, y = _values(a), _values(b)
    if x.size < 2 or y.size < 2:
        raise ValueError(f"Welch's interval needs at least 2 values per side, got {x.size} and {y.size}")
    diff = float(x.mean() - y.mean())
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    if vx + vy == 0:
        return diff, diff, diff
    df = (vx + vy) ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1))
    half = t_quantile(confidence, df) * math.sqrt(vx + vy)
    return diff, diff - half, diff + half


def log_t_interval(ratios: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of positive ``ratios`` and ``t_interval`` of their logs, exponentiated."""
    x = _values(ratios)
    if np.any(x <= 0):
        raise ValueError(f"ratios must be positive, got {x.tolist()}")
    return tuple(math.exp(v) if not math.isnan(v) else v for v in t_interval(np.log(x), confidence))


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, n_resamples: int = 10000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of ``values`` and its percentile-bootstrap confidence interval (see the module
    docstring for why the tables use ``t_interval`` instead).

    Args:
        values: One number per run; at least one, all finite.
        confidence: Coverage asked of the interval, in (0, 1).
        n_resamples: Bootstrap resamples.
        seed: Seed of the resampling, so the interval is reproducible.

    Returns:
        ``(mean, low, high)``. A single value, or identical values, give ``low == high == mean``.
    """
    _check_confidence(confidence)
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    x = _values(values)
    if np.all(x == x[0]):
        v = float(x[0])
        return v, v, v
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(x.mean()), float(low), float(high)


def _load(run: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(run, Mapping):
        return run
    with open(run, encoding="utf-8") as f:
        return json.load(f)


def combine_runs(
    runs: Sequence[str | Path | Mapping[str, Any]], confidence: float = 0.95, n_resamples: int = 10000,
    seed: int = 0, interval: str = "t",
) -> dict[str, Any]:
    """Mean and confidence interval per metric across runs of one evaluation (different seeds).

    Args:
        runs: Result JSON paths, or the result dicts ``evaluate`` returns.
        confidence: Coverage of the intervals.
        interval: ``t`` (``t_interval``, the default) or ``bootstrap`` (``bootstrap_ci``, with
            ``n_resamples`` and ``seed``).

    Returns:
        ``{"benchmark", "model", "ckpt", "k", "n_problems", "n_runs", "seeds", "confidence",
        "interval", "metrics": {name: {"mean", "low", "high", "values"}}}`` for each of ``RUN_METRICS``
        that is a number in every run (so ``maj@k`` of code runs, None, is left out, as is a
        ``ttc_fixed`` that some seed could not measure).

    Raises:
        ValueError: no runs, or runs that disagree on benchmark, k or number of problems.
    """
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {INTERVALS}, got {interval!r}")
    results = [_load(r) for r in runs]
    if not results:
        raise ValueError("combine_runs needs at least one run")
    for field in SAME_ACROSS_RUNS:
        seen = [r.get(field) for r in results]
        if len(set(map(str, seen))) > 1:
            raise ValueError(f"runs disagree on {field!r}: {seen}; combine runs of one evaluation only")
    seeds = [r.get("seed") for r in results]
    metrics = {}
    for name in RUN_METRICS:
        values = [r.get(name) for r in results]
        if any(not isinstance(v, (int, float)) or math.isnan(v) for v in values):
            continue
        if interval == "t":
            mean, low, high = t_interval(values, confidence=confidence)
        else:
            mean, low, high = bootstrap_ci(values, confidence=confidence, n_resamples=n_resamples, seed=seed)
        low, high = (None, None) if math.isnan(low) else (low, high)  # one run: no interval (JSON has no NaN)
        metrics[name] = {"mean": mean, "low": low, "high": high, "values": [float(v) for v in values]}
    first = results[0]
    return {
        "benchmark": first.get("benchmark"),
        "model": first.get("model"),
        "ckpt": first.get("ckpt"),
        "k": first.get("k"),
        "n_problems": first.get("n_problems"),
        "n_runs": len(results),
        "seeds": seeds,
        "duplicate_seeds": len(set(map(str, seeds))) < len(seeds),
        "confidence": confidence,
        "interval": interval,  # t: Student's t over the runs; bootstrap: percentile
        "metrics": metrics,
    }
