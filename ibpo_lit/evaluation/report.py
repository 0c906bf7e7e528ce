"""Result files and the small markdown tables the CLI prints."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

from ibpo_lit.evaluation.bootstrap import RUN_METRICS


def write_json(result: Mapping[str, Any], path: str) -> None:
    """Write ``result`` as indented JSON, creating the parent directory."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


def _metric_label(name: str, k: Any) -> str:
    return name.replace("@k", f"@{k}") if k is not None else name


def run_table(result: Mapping[str, Any]) -> str:
    """One evaluation as a one-row markdown table of the metrics it has (then, for code, the
    sandbox's status counts, and a line per baseline saying what it is)."""
    k = result["k"]
    metrics = [m for m in RUN_METRICS if m in result]
    cols = ["benchmark", "model", "n", "seed"] + [_metric_label(m, k) for m in metrics] + ["seconds"]
    model = result["model"] + (f" + {os.path.basename(result['ckpt'])}" if result.get("ckpt") else "")
    cells = [result["benchmark"], model, str(result["n_problems"]), str(result["seed"])]
    cells += [_fmt(result.get(m)) for m in metrics] + [f"{result['seconds']:.1f}"]
    lines = [_table(cols, [cells])]
    for key in sorted(name for name in result if name.endswith("sandbox_status")):
        counts = ", ".join(f"{status} {n}" for status, n in result[key].items())
        lines.append(f"{key}: {counts}")
    lines += [f"{name}: {note}" for name, note in (result.get("baselines") or {}).items()]
    return "\n".join(lines)


def combined_table(combined: Mapping[str, Any]) -> str:
    """Mean and CI per metric across runs, as a markdown table."""
    k = combined.get("k")
    pct = round(100 * combined["confidence"])
    interval = {"t": "t", "bootstrap": "percentile bootstrap"}.get(combined.get("interval", "bootstrap"))
    rows = [
        [_metric_label(name, k), _fmt(m["mean"]), f"[{_fmt(m['low'])}, {_fmt(m['high'])}]",
         ", ".join(_fmt(v) for v in m["values"])]
        for name, m in combined["metrics"].items()
    ]
    title = (f"{combined['benchmark']} | {combined['model']} | {combined['n_runs']} runs "
             f"(seeds {combined['seeds']}) | {combined['n_problems']} problems\n\n")
    return title + _table(["metric", "mean", f"{pct}% CI ({interval}, n = {combined['n_runs']})", "runs"], rows)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return "-" if value is None else str(value)


def _table(cols: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
