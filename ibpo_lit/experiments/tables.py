"""The report's markdown tables, laid out like the IBPO and CIW papers' (one row per method,
mean and 95% t-interval over seeds in each cell), from run summaries of ``compare.py``.

Covered:
- ``REPORT_TABLES``: baselines vs IBPO, IBPO's Table 3 ablations (k = 1, shaping only), its
  Table 4 lambda sweep and Table 5 alpha sweep, and the CIW comparison.
- A row is an arm within one comparison (one ``summary.json``: one budget). An arm run in
  several comparisons gets a row per comparison, never a pooled one: different budgets are
  different experiments. An arm with no run is a "not run" row; a table with none, a line.
- Rows with fewer than 3 seeds are marked ``*(n=2)*``.
- ``val acc - ref`` (and ``final-eval - ref`` where runs have one): the arm's value minus its
  reference arm's (``TableSpec.references``: the table's baseline, IBPO plain for the ablations,
  the paper's value for the sweeps) at the same seed, with a paired t-interval over the seeds
  both ran: how two arms compare is read here, not from two overlapping intervals.
- ``grad var / baseline``: an arm's gradient-variance trace over its baseline arm's
  (``GRAD_VAR_BASELINES``), paired by seed within the same comparison; geometric mean and a
  t-interval on the logs.
- ``multiplicity_note``: how many paired comparisons the report holds and how much wider a
  Bonferroni interval would be.
- ``eval_tables``: benchmark results combined over seeds (``evaluate --combine``), a row per
  label and a column per benchmark, as the papers' main tables.
Not covered: simultaneous intervals or tests; each interval holds for one comparison
(``evaluation.bootstrap``: with 3 seeds the t multiplier is 4.30).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ibpo_lit.evaluation.bootstrap import combine_runs, paired_t_interval, t_quantile
from ibpo_lit.experiments.arms import ARM_FAMILIES
from ibpo_lit.experiments.cells import (
    ALL_EQUAL,
    MIN_SEEDS,
    ci_cell,
    difference_cell,
    finite,
    paired_ratios,
    paired_values,
    ratio_cell,
    seeds_label,
)

GRAD_VAR_RATIO = "grad_var_ratio"  # derived column: paired ratio to the baseline arm
VAL_GAIN = "val_gain"  # derived column: final_val - baseline_val of the same run
# Derived columns: the arm's value minus its reference arm's at the same seed (paired t).
DIFFERENCES = {"val_diff": "final_val", "final_eval_diff": "final_eval"}
REFERENCE = "reference"  # the cell of a difference column in its reference arm's row

# Baseline of each arm's gradient-variance ratio. IBPO arms against the paper's baseline,
# GSPO with the 4x group at the same compute (METHOD section 6: about 30% lower with IBPO);
# CIW arms against their own optimizer without CIW at the same small group, so the ratio
# isolates the weights. ``ibpo_mask_ciw`` goes against ``gspo`` too: the CIW comparison
# runs no large group, and GSPO at the small group is its common reference.
GRAD_VAR_BASELINES: dict[str, str] = {
    **{arm: "gspo_large_group" for family in ("baselines", "ablations", "lambda", "alpha")
       for arm in ARM_FAMILIES[family] if arm != "gspo_large_group"},
    "dapo_ciw": "dapo",
    "gspo_ciw": "gspo",
    "gspo_ciw_inverted": "gspo",
    "ibpo_mask_ciw": "gspo",
}


@dataclass(frozen=True)
class Column:
    key: str  # a run summary's key, or GRAD_VAR_RATIO / VAL_GAIN
    title: str
    fmt: str
    scale: float = 1.0
    optional: bool = False  # shown only when some row of the table has a value
    bounds: tuple[float, float] | None = None  # the values it can take: intervals are clipped to them


@dataclass(frozen=True)
class TableSpec:
    name: str  # short id: the file name of its figure
    title: str
    arms: tuple[str, ...]
    columns: tuple[Column, ...]
    caption: str = ""
    references: Mapping[str, str] = field(default_factory=dict)  # arm -> arm its differences are to


SHARE = (0.0, 1.0)  # accuracies, rewards, success rates and shares
_VAL = (
    Column("final_val", "val acc, end", "{:.3f}", bounds=SHARE),
    Column("val_diff", "val acc - ref, paired", "{:+.3f}"),
    Column(VAL_GAIN, "val gain vs step 0", "{:+.3f}"),
    # `compare.py --final-eval`: the last checkpoint on N held-out problems x k (compare.md has N, k)
    Column("final_eval", "final-eval, end", "{:.3f}", optional=True, bounds=SHARE),
    Column("final_eval_diff", "final-eval - ref, paired", "{:+.3f}", optional=True),
)
_COST = (Column("steps", "steps", "{:.1f}", bounds=(0.0, math.inf)),
         Column("flops", "TFLOP", "{:.1f}", 1e-12, bounds=(0.0, math.inf)))
IBPO_COLUMNS = (
    *_VAL,
    Column("final_reward", "reward, last 3", "{:.3f}", bounds=SHARE),
    Column("correction_success_last", "corr. success, last 3", "{:.3f}", bounds=SHARE),
    Column("cov_y_phi_negative_share", "Cov(Y,phi)<0 share", "{:.2f}", bounds=SHARE),
    Column(GRAD_VAR_RATIO, "grad var / baseline", "{:.2f}"),
    *_COST,
)
CIW_COLUMNS = (
    *_VAL,
    Column("first_reward", "reward, first 3", "{:.3f}", bounds=SHARE),
    Column("final_reward", "reward, last 3", "{:.3f}", bounds=SHARE),
    Column(GRAD_VAR_RATIO, "grad var / baseline", "{:.2f}"),
    *_COST,
)

def _to(reference: str, arms) -> dict[str, str]:
    return {arm: reference for arm in arms}


REPORT_TABLES: tuple[TableSpec, ...] = (
    TableSpec("baselines", "GSPO with a 4x group against GSPO + IBPO, matched compute",
              tuple(ARM_FAMILIES["baselines"]), IBPO_COLUMNS,
              "The IBPO paper's main comparison: GSPO at G = 4x the IBPO arms' group, all at the same compute.",
              _to("gspo_large_group", ARM_FAMILIES["baselines"])),
    TableSpec("ablations", "Ablations (IBPO Table 3): the counterfactual partner and joint training",
              ("ibpo_plain", *ARM_FAMILIES["ablations"]), IBPO_COLUMNS,
              "k1: each wrong rollout is revised alone, with no reference (the rewrite filter keeps only "
              "d > alpha). shaping_only: corrections shape rewards but are not trained.",
              _to("ibpo_plain", ("ibpo_plain", *ARM_FAMILIES["ablations"]))),
    TableSpec("lambda", "Shaping weight lambda (IBPO Table 4)", tuple(ARM_FAMILIES["lambda"]), IBPO_COLUMNS,
              "IBPO plain, beta = 0.5; the paper's best lambda is about 0.6.",
              _to("lambda_0.6", ARM_FAMILIES["lambda"])),
    TableSpec("alpha", "Full-rewrite threshold alpha (IBPO Table 5)", tuple(ARM_FAMILIES["alpha"]), IBPO_COLUMNS,
              "IBPO plain; adaptive = mean + 2 std of d over each step's successful corrections. "
              "The paper finds 0.55 to 0.70 stable.",
              _to("alpha_0.6", ARM_FAMILIES["alpha"])),
    TableSpec("ciw", "Counterfactual importance weighting (CIW)", tuple(ARM_FAMILIES["ciw"]), CIW_COLUMNS,
              "All at the small group; gspo_ciw_inverted is the paper's inverted-weights ablation.",
              {"dapo": "dapo", "dapo_ciw": "dapo", "gspo": "gspo", "gspo_ciw": "gspo",
               "gspo_ciw_inverted": "gspo", "ibpo_mask_ciw": "gspo"}),
)


def run_value(run: Mapping[str, Any], key: str) -> float | None:
    """A column's value for one run (``VAL_GAIN`` derived, the rest read as is)."""
    if key == VAL_GAIN:
        end, start = run.get("final_val"), run.get("baseline_val")
        return end - start if finite([end]) and finite([start]) else None
    return run.get(key)


def rows_by_comparison(summaries: Sequence[dict], arm: str) -> list[tuple[str, list[dict]]]:
    """``(comparison, runs)`` for each comparison that ran ``arm``, in order of appearance."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for run in summaries:
        if run["arm"] == arm:
            groups[run.get("comparison", "")].append(run)
    return list(groups.items())


def grad_var_ratios(runs: Sequence[dict], arm: str, comparison: str, summaries: Sequence[dict]) -> list[float] | None:
    """Per-seed gradient-variance ratios of ``arm``'s runs to its baseline's within
    ``comparison``; None when ``arm`` has no baseline."""
    baseline = GRAD_VAR_BASELINES.get(arm)
    if baseline is None:
        return None
    base_runs = [r for r in summaries if r["arm"] == baseline and r.get("comparison", "") == comparison]
    return paired_ratios(runs, base_runs, "grad_var_trace")


def grad_var_cell(runs: Sequence[dict], arm: str, comparison: str, summaries: Sequence[dict], fmt: str) -> str:
    """The paired ratio as a cell (geometric mean, t on the logs): ``baseline`` for a baseline
    arm, ``-`` without pairs."""
    ratios = grad_var_ratios(runs, arm, comparison, summaries)
    if ratios is None:
        return "baseline" if arm in GRAD_VAR_BASELINES.values() else "-"
    return ratio_cell(ratios, fmt)


def difference_to_reference(spec: TableSpec, key: str, runs: Sequence[dict], arm: str, comparison: str,
                            summaries: Sequence[dict], fmt: str) -> str:
    """A difference column's cell: ``arm`` minus its reference at the same seeds, same comparison."""
    reference = spec.references.get(arm)
    if reference is None:
        return "-"
    if reference == arm:
        return REFERENCE if finite(r.get(DIFFERENCES[key]) for r in runs) else "-"
    return difference_cell(runs, _reference_runs(reference, comparison, summaries),
                           lambda r: r.get(DIFFERENCES[key]), fmt, n_shown=len(runs))


def _reference_runs(reference: str, comparison: str, summaries: Sequence[dict]) -> list[dict]:
    return [r for r in summaries if r["arm"] == reference and r.get("comparison", "") == comparison]


def _cell(spec: TableSpec, column: Column, arm: str, comparison: str, runs: Sequence[dict],
          summaries: Sequence[dict]) -> str:
    if column.key == GRAD_VAR_RATIO:
        return grad_var_cell(runs, arm, comparison, summaries, column.fmt)
    if column.key in DIFFERENCES:
        return difference_to_reference(spec, column.key, runs, arm, comparison, summaries, column.fmt)
    return ci_cell([run_value(r, column.key) for r in runs], column.fmt, column.scale, column.bounds)


def row_runs(spec: TableSpec, summaries: Sequence[dict]) -> list[tuple[str, str, list[dict]]]:
    """``(arm, comparison, runs)`` per row of ``spec``; ``("arm", "", [])`` for an arm not run."""
    out = []
    for arm in spec.arms:
        out += [(arm, comparison, runs) for comparison, runs in rows_by_comparison(summaries, arm)] or [(arm, "", [])]
    return out


def table_rows(spec: TableSpec, summaries: Sequence[dict]) -> list[dict]:
    """``{"label", "comparison", "n", "cells"}`` per row of ``spec``; ``n = 0`` for an arm
    that has no run (its cells empty)."""
    rows = []
    for arm, comparison, runs in row_runs(spec, summaries):
        cells = [_cell(spec, c, arm, comparison, runs, summaries) for c in spec.columns] if runs else [""] * len(spec.columns)
        rows.append({"label": arm, "comparison": comparison, "n": len(runs), "cells": cells})
    return rows


def markdown_rows(cols: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def table_markdown(spec: TableSpec, summaries: Sequence[dict], image: str | None = None) -> str:
    """One table of the report: its title, caption, rows and notes (and ``image`` below it)."""
    rows = table_rows(spec, summaries)
    out = [f"### {spec.title}", ""]
    if not any(r["n"] for r in rows):
        # the arms whose gradient variance the table divides by run alongside, same budget
        baselines = [GRAD_VAR_BASELINES[a] for a in spec.arms if GRAD_VAR_BASELINES.get(a) not in (None, *spec.arms)]
        arms = " ".join(dict.fromkeys([*baselines, *spec.arms]))
        out.append(f"*Not run yet:* `python scripts/compare.py --arms {arms} --budget-flops ... --out results/compare_{spec.name}`")
        return "\n".join(out)
    comparisons = list(dict.fromkeys(r["comparison"] for r in rows if r["n"]))
    if spec.caption:
        out += [spec.caption, ""]
    out += ["Runs from " + ", ".join(f"`{c}`" for c in comparisons) + ". Each cell: mean [95% t-interval over "
            "the row's seeds, clipped to [0, 1] for accuracies, rewards and shares]; n = the seeds column.", ""]
    several = len(comparisons) > 1  # an arm may then appear once per comparison: say which
    shown = [i for i, c in enumerate(spec.columns)
             if not c.optional or any(r["n"] and r["cells"][i] not in ("-", REFERENCE) for r in rows)]
    cols = ["arm", *(["comparison"] if several else []), "seeds", *(spec.columns[i].title for i in shown)]
    body = []
    for r in rows:
        seeds = str(r["n"]) if r["n"] else "not run"
        label = seeds_label(r["label"], r["n"]) if r["n"] else r["label"]
        cells = [r["cells"][i] for i in shown] if r["n"] else [""] * len(shown)
        body.append([label, *([r["comparison"]] if several else []), seeds, *cells])
    out.append(markdown_rows(cols, body))
    notes = _notes(spec, [{**r, "cells": [r["cells"][i] for i in shown]} for r in rows],
                   [spec.columns[i] for i in shown])
    if notes:
        out += ["", *notes]
    if image:
        out += ["", f"![{spec.title}]({image})"]
    return "\n".join(out)


def _notes(spec: TableSpec, rows: list[dict], columns: Sequence[Column]) -> list[str]:
    notes = []
    if any(0 < r["n"] < MIN_SEEDS for r in rows):
        notes.append(f"*(n=k)*: fewer than {MIN_SEEDS} seeds; the interval says little.")
    if any(c.key in DIFFERENCES for c in columns):
        pairs = sorted({f"{arm} - {ref}" for arm, ref in spec.references.items() if arm != ref and arm in spec.arms})
        notes.append("... - ref, paired: the arm's value minus its reference arm's at the same seed, same comparison ("
                     + ", ".join(pairs) + "), mean [95% paired t-interval over the seeds both ran]. An interval "
                     "that holds 0 shows no difference either way; it does not show the arms are equal.")
    if any(ALL_EQUAL in cell for r in rows for cell in r["cells"]):
        notes.append(f"{ALL_EQUAL}: every seed gave the same value, so there is no spread to build an interval "
                     "from; it is not a certain value (validation accuracy moves in steps of 1/32, steps in whole "
                     "steps, so seeds agree by chance).")
    if any(c.key == GRAD_VAR_RATIO for c in columns):
        pairs = sorted({f"{arm} / {GRAD_VAR_BASELINES[arm]}" for arm in spec.arms if arm in GRAD_VAR_BASELINES})
        notes.append("grad var / baseline: gradient-variance trace over the baseline arm's at the same seed, "
                     "same comparison (" + ", ".join(pairs) + "), geometric mean [95% t-interval on the logs]; "
                     "below 1 = lower variance.")
    return [f"- {n}" for n in notes]


def paired_comparisons(summaries: Sequence[dict]) -> list[dict]:
    """Every distinct validation-accuracy difference the report shows with a paired interval:
    ``{"comparison", "arm", "reference", "a", "b"}`` (``a``, ``b``: the two arms' values at their
    shared seeds). An arm in two tables against one reference counts once."""
    seen: dict[tuple[str, str, str], dict] = {}
    for spec in REPORT_TABLES:
        for arm, comparison, runs in row_runs(spec, summaries):
            reference = spec.references.get(arm)
            if not runs or reference in (None, arm) or (comparison, arm, reference) in seen:
                continue
            a, b = paired_values(runs, _reference_runs(reference, comparison, summaries), lambda r: r.get("final_val"))
            if len(a) >= 2:
                seen[(comparison, arm, reference)] = {"comparison": comparison, "arm": arm, "reference": reference,
                                                      "a": a, "b": b}
    return list(seen.values())


def multiplicity_note(summaries: Sequence[dict], confidence: float = 0.95) -> str:
    """A paragraph on reading many intervals at once: how many paired comparisons the report
    shows, which exclude 0, how many would by chance alone, and what Bonferroni makes of them."""
    pairs = paired_comparisons(summaries)
    m = len(pairs)
    if m < 2:
        return ""
    strict = 1 - (1 - confidence) / m
    excluding, surviving = [], []
    for p in pairs:
        _, low, high = paired_t_interval(p["a"], p["b"], confidence)
        if low > 0 or high < 0:
            excluding.append(f"{p['arm']} - {p['reference']}")
            _, low, high = paired_t_interval(p["a"], p["b"], strict)
            if low > 0 or high < 0:
                surviving.append(excluding[-1])
    seeds = min(len(p["a"]) for p in pairs)
    one, all_m = t_quantile(confidence, seeds - 1), t_quantile(strict, seeds - 1)
    found = (f"{len(excluding)} of them exclude{'s' if len(excluding) == 1 else ''} 0 ({', '.join(excluding)}), "
             "about what chance alone gives" if excluding else "none of them excludes 0")
    return (f"**Many comparisons.** These tables hold {m} paired differences of validation accuracy to a reference "
            f"arm (the `- ref, paired` columns), each with its own {round(100 * confidence)}% interval. The intervals "
            f"are per comparison, not simultaneous: with no true difference anywhere, about "
            f"{m * (1 - confidence):.2f} of {m} would exclude 0 by chance. Here {found}. Holding all {m} at once "
            f"(Bonferroni) takes the t multiplier of {seeds} seeds from {one:.2f} to {all_m:.1f}, every interval "
            f"{all_m / one:.1f}x as wide; then "
            + (f"{', '.join(surviving)} still exclude{'s' if len(surviving) == 1 else ''} 0." if surviving
               else "none excludes 0."))


# ------------------------------------------------------------------ evaluation tables
def _metric_label(metric: str, k: Any) -> str:
    return metric.replace("@k", f"@{k}") if k is not None else metric


def as_combined(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """``result`` in ``combine_runs``'s layout: a combined result as is, one ``evaluate`` run
    combined alone (a single seed: mean only, marked n=1)."""
    if "metrics" in result:
        return result
    if "benchmark" in result and "k" in result:
        return combine_runs([result])
    raise ValueError("not an evaluation result: expected the JSON of `python -m ibpo_lit evaluate --output` "
                     "or of `evaluate --combine ... --output`")


def eval_cell(metric: Mapping[str, Any], n_runs: int, fmt: str = "{:.3f}", interval: str = "t") -> str:
    """``mean [low, high]`` of a metric of ``combine_runs``, marked when ``n_runs < 3`` and when
    the interval is the percentile bootstrap (older combined files)."""
    cell = fmt.format(metric["mean"])
    if n_runs > 1 and metric.get("low") is not None:
        cell += f" [{fmt.format(metric['low'])}, {fmt.format(metric['high'])}]"
        cell += " *(bootstrap)*" if interval == "bootstrap" else ""
    return cell + (f" *(n={n_runs})*" if n_runs < MIN_SEEDS else "")


def eval_tables(evals: Sequence[tuple[str, Mapping[str, Any]]], metrics: Sequence[str] = ("avg@k",)) -> str:
    """One table per metric: a row per label, a column per benchmark, from ``(label,
    combined)`` pairs (``combine_runs``'s output). A label given twice for one benchmark is
    an error: the cell would be ambiguous."""
    labels = list(dict.fromkeys(label for label, _ in evals))
    benchmarks = list(dict.fromkeys(c["benchmark"] for _, c in evals))
    cells: dict[tuple[str, str], Mapping[str, Any]] = {}
    for label, combined in evals:
        key = (label, combined["benchmark"])
        if key in cells:
            raise ValueError(f"two evaluation results for {label!r} on {combined['benchmark']!r}; give one per benchmark")
        cells[key] = combined
    out = []
    for metric in metrics:
        cols = ["method"]
        for bench in benchmarks:
            k = next(c["k"] for (_, b), c in cells.items() if b == bench)
            cols.append(f"{bench} {_metric_label(metric, k)}")
        body = []
        for label in labels:
            row = [label]
            for bench in benchmarks:
                combined = cells.get((label, bench))
                m = combined["metrics"].get(metric) if combined else None
                row.append(eval_cell(m, combined["n_runs"], interval=combined.get("interval", "bootstrap")) if m else "-")
            body.append(row)
        out += [f"### Evaluation: {metric}", "", "Each cell: mean [95% t-interval] over seeds "
                "(`python -m ibpo_lit evaluate --combine`).", "", markdown_rows(cols, body), ""]
    return "\n".join(out).rstrip()


def report_markdown(
    summaries: Sequence[dict],
    images: Mapping[str, str] | None = None,
    evals: Sequence[tuple[str, Mapping[str, Any]]] = (),
    eval_metrics: Sequence[str] = ("avg@k",),
) -> str:
    """Every table of ``REPORT_TABLES`` (each followed by ``images[spec.name]`` when given),
    then the evaluation tables when there are ``evals``."""
    images = images or {}
    parts = [note for note in (multiplicity_note(summaries),) if note]
    parts += [table_markdown(spec, summaries, images.get(spec.name)) for spec in REPORT_TABLES]
    if evals:
        parts.append(eval_tables(evals, eval_metrics))
    return "\n\n".join(parts) + "\n"
