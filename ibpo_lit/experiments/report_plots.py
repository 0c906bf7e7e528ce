"""The report's figure for one table (``tables.REPORT_TABLES``): four panels over its rows.

- training reward against compute (estimated TFLOP, generation and corrections included);
- correction success per step (``train/correction_success``), IBPO arms only;
- ``Cov(Y, phi)`` per step (``ibpo/cov_y_phi``; Assumption A.1 expects it below 0);
- the gradient-variance ratio to each arm's baseline (``tables.GRAD_VAR_BASELINES``): geometric
  mean and 95% t-interval on the logs over seeds (as the tables), with each seed's ratio as a
  dot; 1 = the baseline's variance.
One line per run, one colour per row (an arm within one comparison). matplotlib is imported
only when a figure is drawn.
"""
from __future__ import annotations

import os
from typing import Sequence

import math

from ibpo_lit.evaluation.bootstrap import log_t_interval
from ibpo_lit.experiments.runs import at_compute
from ibpo_lit.experiments.tables import TableSpec, grad_var_ratios, row_runs


def _row_label(arm: str, comparison: str, several: bool) -> str:
    return f"{arm} [{os.path.basename(comparison)}]" if several else arm


def table_figure(spec: TableSpec, summaries: Sequence[dict], path: str) -> bool:
    """Draw ``spec``'s figure to ``path``; False (and nothing written) when no row has runs."""
    rows = [(arm, comparison, runs) for arm, comparison, runs in row_runs(spec, summaries) if runs]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    several = len({comparison for _, comparison, _ in rows}) > 1
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    reward_ax, success_ax, cov_ax, ratio_ax = axes[0][0], axes[0][1], axes[1][0], axes[1][1]
    bars = []
    for n, (arm, comparison, runs) in enumerate(rows):
        colour, label = f"C{n % 10}", _row_label(arm, comparison, several)
        for m, run in enumerate(runs):
            series = run.get("series", {})
            first = label if m == 0 else None  # one legend entry per row
            reward = at_compute(series, "train/reward")
            if reward:
                reward_ax.plot([c / 1e12 for c, _ in reward], [v for _, v in reward], color=colour, alpha=0.7, label=first)
            for ax, tag in ((success_ax, "train/correction_success"), (cov_ax, "ibpo/cov_y_phi")):
                points = series.get(tag, [])
                if points:
                    ax.plot([s for s, _ in points], [v for _, v in points], color=colour, alpha=0.7, label=first)
        ratios = grad_var_ratios(runs, arm, comparison, summaries)
        if ratios:
            bars.append((label, colour, ratios))
    for k, (label, colour, ratios) in enumerate(bars):
        mean, low, high = log_t_interval(ratios)
        error = None if math.isnan(low) else [[mean - low], [high - mean]]  # one seed: no interval
        ratio_ax.bar(k, mean, width=0.6, color=colour, alpha=0.6, yerr=error, capsize=4, ecolor="grey")
        ratio_ax.scatter([k + 0.15] * len(ratios), ratios, color="black", s=12, zorder=3)
    ratio_ax.set_xlim(-0.75, max(len(bars), 2) - 0.25)
    ratio_ax.set_xticks(range(len(bars)), [label for label, _, _ in bars], rotation=20, ha="right", fontsize=8)
    ratio_ax.axhline(1.0, color="grey", lw=1, ls="--")
    if bars:
        ratio_ax.set_yscale("log")  # ratios are multiplicative: 0.5 and 2 lie as far from 1
    cov_ax.axhline(0.0, color="grey", lw=1, ls="--")
    titles = [
        (reward_ax, "training reward", "compute (TFLOP, estimated)"),
        (success_ax, "correction success", "optimizer step"),
        (cov_ax, "Cov(Y, phi)", "optimizer step"),
        (ratio_ax, "grad var / baseline (geometric mean, 95% t; dots: seeds)", ""),
    ]
    for ax, title, xlabel in titles:
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if ax is not ratio_ax and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        if not ax.has_data():
            ax.text(0.5, 0.5, "not logged by these arms", ha="center", va="center", transform=ax.transAxes, color="grey")
    fig.suptitle(spec.title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
