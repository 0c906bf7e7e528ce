"""Confidence intervals across runs (seeds): percentile bootstrap of the mean.

What is covered:
- ``bootstrap_ci``: resample the values with replacement ``n_resamples`` times (numpy's
  ``default_rng(seed)``, so a seed gives the same interval), take each resample's mean, and
  report the sample mean with the ``(1 - confidence)/2`` and ``(1 + confidence)/2`` percentiles
  of those means. This is the paper's "mean and 95% bootstrap CI over 5 seeds".
- ``combine_runs``: several result JSONs of ``evaluate`` (same benchmark and k, different seeds)
  -> per metric the mean, CI and the per-run values.

What is not covered:
- Bias-corrected (BCa) or studentized intervals. With 5 runs a percentile interval is narrow
  (it cannot reach past the smallest and largest run); read it as a spread, not a guarantee.
- Resampling problems within one run (that CI reflects the test set, not the seed).
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


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, n_resamples: int = 10000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of ``values`` and its percentile-bootstrap confidence interval.

    Args:
        values: One number per run (e.g. avg@64 of each seed); at least one, all finite.
        confidence: Coverage of the interval, in (0, 1).
        n_resamples: Bootstrap resamples.
        seed: Seed of the resampling, so the interval is reproducible.

    Returns:
        ``(mean, low, high)``. A single value, or identical values, give ``low == high == mean``.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"values must be finite, got {x.tolist()}")
    if np.all(x == x[0]):  # no spread: the exact value, not a float-rounded mean of copies
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
    runs: Sequence[str | Path | Mapping[str, Any]], confidence: float = 0.95, n_resamples: int = 10000, seed: int = 0
) -> dict[str, Any]:
    """Mean and bootstrap CI per metric across runs of one evaluation (different seeds).

    Args:
        runs: Result JSON paths, or the result dicts ``evaluate`` returns.
        confidence, n_resamples, seed: As in ``bootstrap_ci``.

    Returns:
        ``{"benchmark", "model", "ckpt", "k", "n_problems", "n_runs", "seeds", "confidence",
        "metrics": {name: {"mean", "low", "high", "values"}}}`` for each of ``RUN_METRICS``
        that is a number in every run (so ``maj@k`` of code runs, None, is left out, as is a
        ``ttc_fixed`` that some seed could not measure).

    Raises:
        ValueError: no runs, or runs that disagree on benchmark, k or number of problems.
    """
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
        mean, low, high = bootstrap_ci(values, confidence=confidence, n_resamples=n_resamples, seed=seed)
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
        "metrics": metrics,
    }
