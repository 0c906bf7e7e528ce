"""Markdown tables of the testbed's JSON results (``scripts/exact_gradient.py --report``)."""
from __future__ import annotations

import math


def num(x, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits; ``-`` for None or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def ci(triple, digits: int = 3) -> str:
    """``mean [low, high]``."""
    value, low, high = triple
    return f"{num(value, digits)} [{num(low, digits)}, {num(high, digits)}]"


def signed(triple, digits: int = 3) -> str:
    value, low, high = triple
    return f"{value:+.{digits}g} [{low:+.{digits}g}, {high:+.{digits}g}]"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def fixed_table(rows: list[dict], baseline: str = "gspo") -> str:
    """Every method at one state: cost, corrections, raw and scale-free variance, bias, MSE."""
    key = "vs_" + baseline
    header = ["method", "G", "seq/draw", "success", "shaped", "Cov(Y, phi)", "tr Cov", "tr / gspo", "SNR", "SNR / gspo",
              "cos(E g, grad J)", "E cos(g, grad J)", "rel bias^2", "rel var", "rel MSE", "MSE / gspo",
              "MSE / gspo, equal cost", "cos(E g, grad J_shaped)", "cos(grad J_shaped, grad J)"]
    body = []
    for r in rows:
        s, v = r["stats"], r[key]
        body.append([
            r["method"], str(r["settings"]["group_size"]), num(r["sequences"]), num(r["correction_success"], 2),
            num(r["shaped_frac"], 2), num(r["cov_y_phi"], 2), num(s["trace"]), ci(v["trace"], 2), num(s["snr"]), ci(v["snr"], 2),
            num(s["cos_mean"], 4), num(s["cos_draw"]), num(s["rel_bias2"], 2), num(s["rel_var"]), num(s["rel_mse"]),
            ci(v["rel_mse"], 2), ci(v["rel_mse_cost"], 2), num(r["cos_shaped"], 4), num(r["cos_shaped_true"], 4),
        ])
    return _table(header, body)


def sweep_table(points: list[dict], baseline: str = "gspo") -> str:
    """One axis of a sweep: each value's IBPO methods against GSPO at the same state and G."""
    key = "vs_" + baseline
    header = ["value", "method", "seq/draw", "success", "shaped", "tr / gspo", "SNR / gspo", "cos(E g, grad J)",
              "rel bias^2", "MSE / gspo", "MSE / gspo, equal cost", "cos(E g, grad J_shaped)",
              "cos(grad J_shaped, grad J)"]
    body = []
    for point in points:
        for r in point["rows"]:
            if r["method"] == baseline:
                continue
            s, v = r["stats"], r[key]
            body.append([str(point["value"]), r["method"], num(r["sequences"]), num(r["correction_success"], 2),
                         num(r["shaped_frac"], 2), ci(v["trace"], 2), ci(v["snr"], 2), num(s["cos_mean"], 4),
                         num(s["rel_bias2"], 2), ci(v["rel_mse"], 2), ci(v["rel_mse_cost"], 2), num(r["cos_shaped"], 4),
                         num(r["cos_shaped_true"], 4)])
    return _table(header, body)


def baseline_table(points: list[dict], baseline: str = "gspo") -> str:
    """The baseline's own numbers at each point of a sweep (they change with G and T)."""
    header = ["value", "J", "seq/draw", "tr Cov", "SNR", "cos(E g, grad J)", "rel bias^2", "rel var", "rel MSE"]
    body = []
    for point in points:
        r = next(r for r in point["rows"] if r["method"] == baseline)
        s = r["stats"]
        body.append([str(point["value"]), num(point["state"]["J"]), num(r["sequences"]), num(s["trace"]), num(s["snr"]),
                     num(s["cos_mean"], 4), num(s["rel_bias2"], 2), num(s["rel_var"]), num(s["rel_mse"])])
    return _table(header, body)


def curves_table(summaries: list[dict], targets=(0.8, 0.9), step: str = "50", budget: str = "4000",
                 final: str = "150") -> str:
    """Learning curves: seeds reaching each target, steps and sequences to it, J at a step, at
    a sequence budget and at the end, collapsed prompts; every d is paired with the baseline."""
    header = ["config", "vs", "seeds", "seq/step"]
    for t in targets:
        header += [f"reached {t}", f"steps to {t}", "d steps", f"seq to {t}", "d seq"]
    header += [f"J @ {step} steps", "d J", f"J @ {budget} seq", "d J", f"J @ {final} steps", "d J",
               "collapsed prompts", "d"]
    body = []
    for s in summaries:
        row = [s["label"], s["baseline"], str(s["seeds"]), num(s["sequences_per_step"])]
        for t in targets:
            rec = s[f"target_{t}"]
            row += [f"{rec['reached']}/{s['seeds']}", ci(rec["steps"]), signed(rec["steps_diff"]),
                    ci(rec["sequences"]), signed(rec["sequences_diff"])]
        at_step = s["J_at_step"].get(step)
        at_budget = s["J_at_sequences"][budget]
        at_final = s["J_at_step"].get(final)
        row += [ci(at_step["value"]) if at_step else "-", signed(at_step["diff"]) if at_step else "-",
                ci(at_budget["value"]), signed(at_budget["diff"]),
                ci(at_final["value"]) if at_final else "-", signed(at_final["diff"]) if at_final else "-",
                ci(s["collapsed_prompts"]["value"]), signed(s["collapsed_prompts"]["diff"])]
        body.append(row)
    return _table(header, body)


# ---------------------------------------------------------------------- condensed tables (docs)
FIXED_COLUMNS = ("method", "seq/draw", "success", "tr / gspo", "SNR / gspo", "cos(E g, grad J)", "MSE / gspo",
                 "MSE / gspo, equal cost", "cos(E g, grad J_shaped)")


def fixed_summary(rows: list[dict], baseline: str = "gspo") -> str:
    """The fixed-policy table, fewer columns."""
    key = "vs_" + baseline
    body = [[r["method"] + ("" if r["settings"]["group_size"] == 8 else f" (G={r['settings']['group_size']})"),
             num(r["sequences"]), num(r["correction_success"], 2), ci(r[key]["trace"], 2), ci(r[key]["snr"], 2),
             num(r["stats"]["cos_mean"], 4), ci(r[key]["rel_mse"], 2), ci(r[key]["rel_mse_cost"], 2),
             num(r["cos_shaped"], 4)] for r in rows]
    return _table(list(FIXED_COLUMNS), body)


def sweep_summary(by_state: dict[str, list[dict]], method: str = "ibpo_plain", baseline: str = "gspo") -> str:
    """One method along one axis, the states side by side: success, SNR and MSE ratios."""
    key = "vs_" + baseline
    header = ["value"]
    for state in by_state:
        header += [f"success ({state})", f"SNR / gspo ({state})", f"MSE / gspo ({state})", f"equal cost ({state})"]
    values = [p["value"] for p in next(iter(by_state.values()))]
    body = []
    for i, value in enumerate(values):
        row = [str(value)]
        for points in by_state.values():
            r = next(r for r in points[i]["rows"] if r["method"] == method)
            row += [num(r["correction_success"], 2), ci(r[key]["snr"], 2), ci(r[key]["rel_mse"], 2),
                    ci(r[key]["rel_mse_cost"], 2)]
        body.append(row)
    return _table(header, body)


def curves_summary(summaries: list[dict], target: float = 0.8, budget: str = "4000", final: str = "150") -> str:
    """Learning curves, fewer columns: each d is paired by seed with the row's baseline."""
    header = ["config", "vs", "seeds", "seq/step", f"reached {target}", f"d steps to {target}",
              f"d seq to {target}", f"d J @ {budget} seq", f"d J @ {final} steps", "d collapsed prompts"]
    body = []
    for s in summaries:
        rec = s[f"target_{target}"]
        at_final = s["J_at_step"].get(final)
        body.append([s["label"], s["baseline"], str(s["seeds"]), num(s["sequences_per_step"]),
                     f"{rec['reached']}/{s['seeds']}", signed(rec["steps_diff"]), signed(rec["sequences_diff"]),
                     signed(s["J_at_sequences"][budget]["diff"]), signed(at_final["diff"]) if at_final else "-",
                     signed(s["collapsed_prompts"]["diff"])])
    return _table(header, body)


def mean_curves_table(mean_curves: dict, labels: list[str], steps=(0, 25, 50, 100, 150)) -> str:
    """Mean exact J over seeds at a few steps, one row per configuration."""
    header = ["config"] + [f"J @ {k}" for k in steps]
    body = [[label] + [num(mean_curves[label][k]) for k in steps] for label in labels
            if mean_curves.get(label) and len(mean_curves[label]) > max(steps)]
    return _table(header, body)
