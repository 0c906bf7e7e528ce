"""Every estimator against the exact policy gradient, on a tiny enumerable policy (issue 34, item 2).

    nice -n 10 python scripts/exact_gradient.py --stage fixed   # the methods at 3 policy states
    nice -n 10 python scripts/exact_gradient.py --stage sweeps  # lambda, skill, locality, alpha, G, T
    nice -n 10 python scripts/exact_gradient.py --stage curves  # learning curves over seeds
    python scripts/exact_gradient.py --report                   # results/exact_gradient/report.md again

Writes ``fixed.json``, ``sweeps.json``, ``curves.json``, ``report.md`` (the markdown tables of
all three) and ``summary.md`` (fewer columns, as docs/exact_gradient.md shows them) under ``--out`` (default ``results/exact_gradient``). ``--quick`` shrinks every count
(a smoke run for the tests). The testbed, the statistics and their definitions:
``ibpo_lit/experiments/exact_gradient/``; what the numbers say: docs/exact_gradient.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ibpo_lit.experiments.exact_gradient.catalog import SWEEPS, main_methods, matched_gspo, sweep_point  # noqa: E402
from ibpo_lit.experiments.exact_gradient.corrector import CorrectorSpec  # noqa: E402
from ibpo_lit.experiments.exact_gradient.estimators import Method  # noqa: E402
from ibpo_lit.experiments.exact_gradient.experiment import (  # noqa: E402
    config_record,
    mean_curve,
    measure_state,
    policy_states,
    run_curves,
    state_summary,
    summarize_curves,
)
from ibpo_lit.experiments.exact_gradient.problem import Problem  # noqa: E402
from ibpo_lit.experiments.exact_gradient.report import (  # noqa: E402
    baseline_table,
    curves_summary,
    curves_table,
    fixed_summary,
    fixed_table,
    mean_curves_table,
    sweep_summary,
    sweep_table,
)

LEVELS = [0.4, 0.6]  # the trained states: the first GSPO iterate with J >= each
SWEEP_STATES = ("init", "J>=0.4")
# compared with GSPO at G = 10 too, whose sequences per step match IBPO's over a run
MATCHED = ("gspo", "ibpo_plain", "ibpo_ratio", "ibpo_mask", "ibpo_corrections_only", "ibpo_k1", "gspo_G10")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _json(obj):
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json(v) for v in obj]
    return obj


def write(path: Path, data: dict, compact: bool = False) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_json(data), separators=(",", ":")) if compact else json.dumps(_json(data), indent=1))
    os.replace(tmp, path)
    log(f"wrote {path}")


def setup(args) -> dict:
    return {"num_prompts": 8, "length": 8, "vocab": 2, "hidden": 64, "group_size": 8, "draws": args.draws,
            "sweep_draws": args.sweep_draws, "resamples": args.resamples, "shaped_samples": args.shaped_samples, "state_levels": LEVELS, "state_lr": 0.01, "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def stage_fixed(args, out: Path) -> None:
    problem = Problem()
    states = policy_states(problem, LEVELS)
    result = {"setup": setup(args), "states": {}, "rows": {}}
    for name, policy in states.items():
        log(f"fixed: state {name}")
        methods = main_methods()
        rows = measure_state(methods, policy, args.draws, resamples=args.resamples, shaped_samples=args.shaped_samples)
        ibpo = next(r for r in rows if r["method"] == "ibpo_plain")
        matched = max(2, round(ibpo["sequences"] / problem.num_prompts))
        rows += [r for r in measure_state([methods[0], matched_gspo(matched)], policy, args.draws,
                                          resamples=args.resamples) if r["method"] != "gspo"]
        result["states"][name] = state_summary(policy)
        result["rows"][name] = rows
        write(out / "fixed.json", result)


def stage_sweeps(args, out: Path) -> None:
    result = {"setup": setup(args), "axes": {}}
    states_by_length = {}
    for axis, values in SWEEPS.items():
        result["axes"][axis] = {}
        for state_name in SWEEP_STATES:
            points = []
            for value in values:
                methods, problem_changes = sweep_point(axis, value)
                length = problem_changes.get("length", 8)
                if length not in states_by_length:
                    states_by_length[length] = policy_states(Problem(length=length), [0.4])
                policy = states_by_length[length][state_name]
                start = time.perf_counter()
                rows = measure_state(methods, policy, args.sweep_draws, resamples=args.resamples,
                                     shaped_samples=args.shaped_samples)
                points.append({"value": value, "state": state_summary(policy), "rows": rows})
                log(f"sweeps: {axis}={value} at {state_name} ({time.perf_counter() - start:.0f}s)")
            result["axes"][axis][state_name] = points
        write(out / "sweeps.json", result)


def curve_configs() -> tuple[list[dict], list[dict]]:
    """(main configs, sweep configs) of the learning curves."""
    base = Problem()
    main = []
    for method in main_methods():
        if method.name == "grpo":  # the same estimator as GSPO on-policy (tests check it)
            continue
        main.append({"label": method.name, "method": method, "problem": base, "lr": 0.01, "baseline": "gspo"})
    for g in (10, 12, 16):  # 10: about IBPO's sequences per step over a run (matched cost)
        main.append({"label": f"gspo_G{g}", "method": matched_gspo(g), "problem": base, "lr": 0.01, "baseline": "gspo"})
    plain = next(m for m in main_methods() if m.name == "ibpo_plain")
    sweep = []
    for lam in (0.2, 1.0, 1.9):
        sweep.append({"label": f"ibpo_plain_lam{lam}", "method": plain.with_(lam=lam), "problem": base, "lr": 0.01,
                      "baseline": "gspo"})
    for spec in (CorrectorSpec("informative", 0.0, 0.1), CorrectorSpec("informative", 1.0, 0.0),
                 CorrectorSpec("uninformative", 1.0)):
        label = f"ibpo_plain_{spec.kind}_skill{spec.skill}_loc{spec.locality}"
        sweep.append({"label": label, "method": plain.with_(corrector=spec), "problem": base, "lr": 0.01,
                      "baseline": "gspo"})
    for g in (4, 16):
        sweep.append({"label": f"ibpo_plain_G{g}", "method": plain.with_(group_size=g), "problem": base, "lr": 0.01,
                      "baseline": f"gspo_G{g}"})
    sweep.append({"label": "gspo_G4", "method": matched_gspo(4), "problem": base, "lr": 0.01, "baseline": "gspo_G4"})
    long = Problem(length=10)
    sweep.append({"label": "gspo_T10", "method": Method("gspo"), "problem": long, "lr": 0.01, "baseline": "gspo_T10"})
    sweep.append({"label": "ibpo_plain_T10", "method": plain, "problem": long, "lr": 0.01, "baseline": "gspo_T10"})
    for lr in (0.003, 0.03):
        sweep.append({"label": f"gspo_lr{lr}", "method": Method("gspo"), "problem": base, "lr": lr,
                      "baseline": f"gspo_lr{lr}"})
        sweep.append({"label": f"ibpo_plain_lr{lr}", "method": plain, "problem": base, "lr": lr,
                      "baseline": f"gspo_lr{lr}"})
    return main, sweep


def stage_curves(args, out: Path) -> None:
    main, sweep = curve_configs()
    if args.quick:
        keep = set(MATCHED) | {"gspo"}
        main = [c for c in main if c["label"] in keep]
        sweep = [c for c in sweep if c["label"] in ("gspo_G4", "ibpo_plain_G4")]
    runs = run_curves(main, args.seeds, args.steps, log=log)
    sweep_runs = run_curves([c for c in sweep if c["baseline"] == c["label"]] +
                            [c for c in sweep if c["baseline"] != c["label"]], args.sweep_seeds, args.steps, log=log)
    by_label = {c["label"]: c for c in main + sweep}
    sweep_needed = {c["baseline"] for c in sweep} - {c["label"] for c in sweep}
    for label in sorted(sweep_needed):  # baselines from the main set, at the sweep's seeds
        sweep_runs += [r for r in runs if r["label"] == label and r["seed"] < args.sweep_seeds]
    result = {
        "setup": {**setup(args), "seeds": args.seeds, "sweep_seeds": args.sweep_seeds, "steps": args.steps,
                  "optimizer": "Adam"},
        "configs": [config_record(c) for c in main + sweep],
        "summaries": summarize_curves(main, runs),
        "matched_summaries": summarize_curves([{"label": m, "baseline": "gspo_G10"} for m in MATCHED], runs),
        "sweep_summaries": summarize_curves(sweep, sweep_runs),
        "mean_curves": {label: mean_curve(runs + sweep_runs, label) for label in by_label},
        "runs": [{**r, "curve": [round(v, 5) for v in r["curve"]]} for r in runs + sweep_runs],
    }
    write(out / "curves.json", result, compact=True)  # 1,500 runs of 151 points each


def report(out: Path) -> str:
    parts = ["# Exact-gradient testbed: tables", "",
             "Generated by `scripts/exact_gradient.py --report` from the JSON files beside it.", ""]
    fixed = out / "fixed.json"
    if fixed.exists():
        data = json.loads(fixed.read_text())
        for name, rows in data["rows"].items():
            state = data["states"][name]
            parts += [f"## Fixed policy, state `{name}` (J = {state['J']:.3f}, |grad J| = {state['true_grad_norm']:.3g}), "
                      f"{data['setup']['draws']} draws per method", "", fixed_table(_nan(rows)), ""]
    sweeps = out / "sweeps.json"
    if sweeps.exists():
        data = json.loads(sweeps.read_text())
        for axis, by_state in data["axes"].items():
            for state, points in by_state.items():
                parts += [f"## Sweep `{axis}` at state `{state}`, {data['setup']['sweep_draws']} draws", "",
                          sweep_table(_nan(points)), "", "GSPO (the baseline) at each value:", "",
                          baseline_table(_nan(points)), ""]
    curves = out / "curves.json"
    if curves.exists():
        data = json.loads(curves.read_text())
        s = data["setup"]
        parts += [f"## Learning curves, {s['seeds']} seeds, {s['steps']} Adam steps", "",
                  curves_table(data["summaries"]), "",
                  "Against GSPO at G = 10 (about IBPO's sequences per step over a run), the same runs:", "",
                  curves_table(data["matched_summaries"]), "",
                  f"## Learning-curve sweeps, {s['sweep_seeds']} seeds", "", curves_table(data["sweep_summaries"]), ""]
    text = "\n".join(parts)
    (out / "report.md").write_text(text)
    (out / "summary.md").write_text(summary(out))
    return text


def summary(out: Path) -> str:
    """The condensed tables docs/exact_gradient.md shows (summary.md)."""
    parts = ["# Exact-gradient testbed: condensed tables", "",
             "Generated by `scripts/exact_gradient.py --report`; every column is in report.md too.", ""]
    fixed = out / "fixed.json"
    if fixed.exists():
        data = json.loads(fixed.read_text())
        for name, rows in data["rows"].items():
            parts += [f"### Fixed policy `{name}` (J = {data['states'][name]['J']:.3f})", "",
                      fixed_summary(_nan(rows)), ""]
    sweeps = out / "sweeps.json"
    if sweeps.exists():
        data = json.loads(sweeps.read_text())
        for axis, by_state in data["axes"].items():
            parts += [f"### Sweep `{axis}`: ibpo_plain against GSPO (same G, same rollouts)", "",
                      sweep_summary(_nan(by_state)), ""]
    curves = out / "curves.json"
    if curves.exists():
        data = json.loads(curves.read_text())
        parts += ["### Learning curves", "", curves_summary(data["summaries"] + data.get("matched_summaries", [])
                                                            + data["sweep_summaries"]), "",
                  "### Mean learning curves (exact J, mean over seeds)", "",
                  mean_curves_table(data["mean_curves"], [c["label"] for c in data["configs"]]), ""]
    return "\n".join(parts)


def _nan(obj):
    """JSON null back to NaN."""
    if obj is None:
        return math.nan
    if isinstance(obj, dict):
        return {k: _nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan(v) for v in obj]
    return obj


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["fixed", "sweeps", "curves", "all"], default=None)
    parser.add_argument("--report", action="store_true", help="write report.md from the JSON files")
    parser.add_argument("--out", default="results/exact_gradient")
    parser.add_argument("--draws", type=int, default=500, help="gradient draws per method, fixed stage")
    parser.add_argument("--sweep_draws", type=int, default=300, help="gradient draws per method, sweeps")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--shaped_samples", type=int, default=32, help="corrections per response for Delta_bar")
    parser.add_argument("--seeds", type=int, default=50, help="learning-curve seeds, main methods")
    parser.add_argument("--sweep_seeds", type=int, default=30, help="learning-curve seeds, sweeps")
    parser.add_argument("--steps", type=int, default=150, help="Adam steps per learning curve")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.draws = args.sweep_draws = 6
        args.resamples, args.seeds, args.sweep_seeds, args.steps, args.shaped_samples = 20, 2, 2, 5, 1
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = ["fixed", "sweeps", "curves"] if args.stage == "all" else [args.stage] if args.stage else []
    for stage in stages:
        start = time.perf_counter()
        {"fixed": stage_fixed, "sweeps": stage_sweeps, "curves": stage_curves}[stage](args, out)
        log(f"stage {stage}: {time.perf_counter() - start:.0f}s")
    if args.report or stages:
        report(out)
        log(f"wrote {out / 'report.md'}")


if __name__ == "__main__":
    main()
