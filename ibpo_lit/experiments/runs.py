"""Finished runs as small JSON-able summaries: the series an experiment plots and the
numbers its tables report, read from a run's TensorBoard events.

A summary is kept in the repository (a few KB per run), so reports and plots can be
rebuilt without rerunning anything.
"""
from __future__ import annotations

import glob
import json
import math
import os
from typing import Iterable

# Series every summary keeps (those a run did not log are left out).
SERIES = [
    "train/reward",
    "train/shaped_reward",
    "train/correction_success",
    "train/rewrite_rate",
    "train/response_len",
    "train/loss",
    "val/accuracy",
    "compute/flops",
    "compute/device_seconds",
    "grad_var/trace",
    "grad_var/relative",
    "ibpo/cov_y_phi",
    "ibpo/correction_success_cum",
]


def read_scalars(log_dir: str, tags: Iterable[str] = SERIES) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` from every TensorBoard event file under ``log_dir``
    (all versions, in order), for the tags that were logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True))
    if not files:
        raise FileNotFoundError(f"no TensorBoard event files under {log_dir}")
    wanted = set(tags)
    out: dict[str, list[tuple[int, float]]] = {}
    for path in files:
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in wanted & set(acc.Tags()["scalars"]):
            out.setdefault(tag, []).extend((e.step, float(e.value)) for e in acc.Scalars(tag))
    return out


def _drop_repeats(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Drop a point that repeats the previous step's value exactly. Runs logged before
    GradientVarianceLogger wrote to the loggers directly got each measurement re-emitted
    by Lightning on the steps in between; two real measurements are never bit-identical."""
    out: list[tuple[int, float]] = []
    for step, value in sorted(points):
        if out and out[-1][1] == value and step == out[-1][0] + 1:
            continue
        out.append((step, value))
    return out


def at_compute(series: dict[str, list[tuple[int, float]]], tag: str, compute: str = "compute/flops") -> list[tuple[float, float]]:
    """``tag`` against cumulative compute: each value paired with the compute logged at the
    same step (validation runs between steps, so it takes the last compute at or before)."""
    points = sorted(series.get(compute, []))
    if not points or tag not in series:
        return []
    out = []
    for step, value in sorted(series[tag]):
        before = [c for s, c in points if s <= step]
        out.append((before[-1] if before else 0.0, value))
    return out


def summarize_run(log_dir: str, arm: str, seed: int, baseline_val: float | None = None, tail: int = 3) -> dict:
    """The JSON summary of one run: its series, and final numbers for the tables.

    ``final_reward`` is the mean training reward over the last ``tail`` steps (a single
    step's reward is a handful of prompts); ``final_val`` the last validation accuracy.
    """
    series = read_scalars(log_dir)
    for tag in [t for t in series if t.startswith("grad_var/")]:
        series[tag] = _drop_repeats(series[tag])

    def values(tag: str) -> list[float]:
        return [v for _, v in sorted(series.get(tag, [])) if not math.isnan(v)]

    reward = values("train/reward")
    success = values("train/correction_success")
    val = values("val/accuracy")
    grad_var = values("grad_var/trace")
    cov = values("ibpo/cov_y_phi")
    return {
        "arm": arm,
        "seed": seed,
        "steps": len(reward),
        "flops": values("compute/flops")[-1] if values("compute/flops") else None,
        "device_seconds": values("compute/device_seconds")[-1] if values("compute/device_seconds") else None,
        "baseline_val": baseline_val,
        "final_val": val[-1] if val else None,
        "first_reward": _mean(reward[:tail]),
        "final_reward": _mean(reward[-tail:]),
        "grad_var_trace": _mean(grad_var),
        "correction_success_first": _mean(success[:tail]),
        "correction_success_last": _mean(success[-tail:]),
        "cov_y_phi_negative_share": (sum(c < 0 for c in cov) / len(cov)) if cov else None,
        "series": {tag: [[s, v] for s, v in sorted(points)] for tag, points in series.items()},
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def read_comparison(path: str) -> list[dict]:
    """The run summaries of one comparison (its ``summary.json``, or the folder holding it),
    each tagged with ``comparison``: that folder. Raises ``ValueError`` for a JSON that is not
    a list of run summaries (other scripts write ``summary.json`` files too)."""
    file = os.path.join(path, "summary.json") if os.path.isdir(path) else path
    with open(file) as f:
        runs = json.load(f)
    if not isinstance(runs, list) or not all(isinstance(r, dict) and "arm" in r and "seed" in r for r in runs):
        raise ValueError(f"{file} is not a comparison summary (a list of runs from scripts/compare.py)")
    folder = os.path.normpath(os.path.dirname(file) or ".")
    return [{**run, "comparison": folder} for run in runs]
