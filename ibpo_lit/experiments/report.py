"""Tables and plots of a comparison from run summaries (``runs.summarize_run``): means and
95% t-intervals across seeds (``cells``), and the series against compute."""
from __future__ import annotations

import math
from collections import defaultdict

from ibpo_lit.evaluation.bootstrap import log_t_interval, paired_t_interval
from ibpo_lit.experiments.cells import ci_cell, paired_ratios, paired_values
from ibpo_lit.experiments.runs import at_compute

TABLE_COLUMNS = [
    ("steps", "steps", "{:.1f}"),
    ("flops", "TFLOP", "{:.1f}"),
    ("device_seconds", "CPU-s", "{:.0f}"),
    ("baseline_val", "val acc @0", "{:.3f}"),
    ("final_val", "val acc, end", "{:.3f}"),
    ("first_reward", "reward, first 3", "{:.3f}"),
    ("final_reward", "reward, last 3", "{:.3f}"),
    ("grad_var_trace", "grad var (trace)", "{:.3g}"),
    ("correction_success_first", "corr. success, first 3", "{:.3f}"),
    ("correction_success_last", "corr. success, last 3", "{:.3f}"),
    ("cov_y_phi_negative_share", "Cov(Y,phi)<0 share", "{:.2f}"),
]

# `scripts/compare.py --final-eval`: shown when some run has them.
FINAL_EVAL_COLUMNS = [
    ("baseline_eval", "final-eval @0", "{:.3f}"),
    ("final_eval", "final-eval, end", "{:.3f}"),
]


# Accuracies, rewards, success rates and shares: their intervals are clipped to [0, 1]; the other
# columns (steps, compute, seconds, variance) to [0, inf).
SHARES = {"baseline_val", "final_val", "first_reward", "final_reward", "correction_success_first",
          "correction_success_last", "cov_y_phi_negative_share", "baseline_eval", "final_eval"}


def by_arm(summaries: list[dict]) -> dict[str, list[dict]]:
    arms: dict[str, list[dict]] = defaultdict(list)
    for summary in summaries:
        arms[summary["arm"]].append(summary)
    return dict(arms)


def markdown_table(summaries: list[dict]) -> str:
    """One row per arm: mean [95% t-interval] over its seeds for each column."""
    columns = TABLE_COLUMNS + [c for c in FINAL_EVAL_COLUMNS if any(s.get(c[0]) is not None for s in summaries)]
    header = "| arm | seeds | " + " | ".join(title for _, title, _ in columns) + " |"
    lines = [header, "|" + " --- |" * (len(columns) + 2)]
    for arm, runs in by_arm(summaries).items():
        cells = []
        for key, _, fmt in columns:
            scale = 1e-12 if key == "flops" else 1.0
            cells.append(ci_cell([r.get(key) for r in runs], fmt, scale, (0.0, 1.0) if key in SHARES else (0.0, math.inf)))
        lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gradient_variance_ratio(summaries: list[dict], arm: str, baseline: str) -> tuple[float, float, float, int] | None:
    """``(geometric mean, low, high, seeds)`` of ``arm``'s gradient-variance trace over
    ``baseline``'s, pairing seeds, with a 95% t-interval on the logs (NaN bounds for one seed)."""
    arms = by_arm(summaries)
    if arm not in arms or baseline not in arms:
        return None
    ratios = paired_ratios(arms[arm], arms[baseline], "grad_var_trace")
    return (*log_t_interval(ratios), len(ratios)) if ratios else None


def paired_difference(summaries: list[dict], arm: str, baseline: str, key: str = "final_val"
                      ) -> tuple[float, float, float, int] | None:
    """``(mean, low, high, seeds)`` of ``arm``'s ``key`` minus ``baseline``'s at the same seed,
    with a 95% paired t-interval (NaN bounds for one pair); None without a pair."""
    arms = by_arm(summaries)
    if arm not in arms or baseline not in arms:
        return None
    a, b = paired_values(arms[arm], arms[baseline], lambda r: r.get(key))
    return (*paired_t_interval(a, b), len(a)) if a else None


def plot(summaries: list[dict], path: str) -> None:
    """Four panels: training reward and validation accuracy against compute, correction
    success over steps, gradient-variance trace over steps; one line per run, a colour per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    colours = {}
    for run in summaries:
        colour = colours.setdefault(run["arm"], f"C{len(colours)}")
        series = run["series"]
        label = run["arm"] if run is next(r for r in summaries if r["arm"] == run["arm"]) else None
        for ax, tag in ((axes[0][0], "train/reward"), (axes[0][1], "val/accuracy")):
            points = at_compute(series, tag)
            if tag == "val/accuracy" and run.get("baseline_val") is not None:
                points = [(0.0, run["baseline_val"])] + points
            if points:
                ax.plot([c / 1e12 for c, _ in points], [v for _, v in points], color=colour, alpha=0.7,
                        marker="o" if tag == "val/accuracy" else None, label=label)
        for ax, tag in ((axes[1][0], "train/correction_success"), (axes[1][1], "grad_var/trace")):
            points = series.get(tag, [])
            if points:
                ax.plot([s for s, _ in points], [v for _, v in points], color=colour, alpha=0.7, label=label)
    titles = [
        ("training reward", "compute (TFLOP, estimated)"),
        ("validation accuracy (avg@k)", "compute (TFLOP, estimated)"),
        ("correction success", "optimizer step"),
        ("policy-gradient variance (trace)", "optimizer step"),
    ]
    for ax, (title, xlabel) in zip([a for row in axes for a in row], titles):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    axes[1][1].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
