"""Compute-matched comparison of arms: by default GSPO with a large group against GSPO + IBPO
with a group 4x smaller.

    python scripts/compare.py --base configs/smollm2_135m_cpu.yaml --seeds 0 1 2 \
        --budget-flops 6e13 --out results/compare_smollm2

Arms (``ibpo_lit/experiments/arms.py``, ``ARM_FAMILIES``), all at ``--small-group`` but the first:
- baselines: ``gspo_large_group`` (4x group), ``ibpo_plain``, ``ibpo_ratio``, ``ibpo_mask``;
- ablations (IBPO Table 3): ``k1`` (no counterfactual partner), ``shaping_only``;
- lambda sweep (Table 4): ``lambda_0.2`` ... ``lambda_1.0``, and ``lambda_0`` (corrections made and
  trained, no shaping; results/lambda_shaping/PROTOCOL.md); alpha sweep (Table 5):
  ``alpha_0.5``, ``alpha_0.6``, ``alpha_0.7``, ``alpha_adaptive``;
- CIW: ``dapo``, ``dapo_ciw``, ``gspo``, ``gspo_ciw``, ``ibpo_mask_ciw``, ``gspo_ciw_inverted``.
Run an arm with its gradient-variance baseline (``gspo_large_group`` for IBPO arms, ``gspo`` or
``dapo`` for CIW ones; ``experiments/tables.py``) in the same comparison, so the ratio pairs seeds
at one budget. ``scripts/report.py`` gathers finished comparisons into the papers' tables.

Every arm runs each seed until the same compute budget (estimated FLOPs, generation and
corrections included, or measured device-seconds), or, with ``--max-steps``, for the same number
of steps (the base config's learning-rate schedule kept). The seed is ``seed_everything``: every
arm at one seed draws the same training problems, and seeds differ in them unless the base config
pins ``data.arithmetic.seed`` / ``data.seed`` (each summary records its ``problem_seed``); the held-out problems are the same for every seed and arm. A
held-out validation set is scored before training (step 0) and every ``--val-every`` steps.
Writes, under ``--out``: ``summary.json`` (one small summary per run, kept so the report can
be rebuilt with ``--report-only``), ``compare.md`` (means and 95% t-intervals across seeds)
and ``compare.png``. With ``--final-eval N``, each run's last checkpoint is also evaluated on the
first N held-out problems x ``--final-eval-k`` samples with ``python -m ibpo_lit evaluate``
(vLLM by default; the untrained model once, as the step-0 point), and compare.md gives each
arm's difference to its baseline paired by seed and problem
(``ibpo_lit/experiments/final_eval.py``). Runs whose summary exists are not run again, so an interrupted
comparison resumes where it stopped; two comparisons may share one ``--out`` (two sweeps at
once, or one arm's seeds split over two processes, one per core): summaries are merged under a
lock, and a run that another process is training is skipped, not trained twice. An arm whose config equals an
arm already run at that seed (``lambda_0.6`` and ``alpha_0.6`` are ``ibpo_plain`` on the
shipped configs) is not trained again: its summary is that run's, marked ``same_run_as``. Run logs go to
``<out>/runs/`` (not meant for git).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from typing import Optional

import yaml

from ibpo_lit.evaluation.bootstrap import t_interval
from ibpo_lit.experiments import final_eval
from ibpo_lit.experiments.arms import ARMS, ArmSettings, build_arm_config, same_config_arm
from ibpo_lit.experiments.cells import interval_text
from ibpo_lit.experiments.report import gradient_variance_ratio, markdown_table, paired_difference, plot
from ibpo_lit.experiments.runs import read_scalars, summarize_run
from ibpo_lit.experiments.summary_store import load_summaries, record_summary
from ibpo_lit.file_lock import claim, exclusive_lock
from ibpo_lit.seeds import stream_seed
from ibpo_lit.experiments.tables import GRAD_VAR_BASELINES


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="configs/smollm2_135m_cpu.yaml", help="config every arm starts from")
    p.add_argument("--arms", nargs="+", default=["gspo_large_group", "ibpo_plain"], choices=sorted(ARMS), metavar="ARM",
                   help="arms to run, from: " + ", ".join(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--small-group", type=int, default=8, help="G of the IBPO arms (GSPO gets 4x)")
    p.add_argument("--budget-flops", type=float, default=None, help="estimated FLOPs per run")
    p.add_argument("--budget-seconds", type=float, default=None, help="device-seconds per run")
    p.add_argument("--max-steps", type=int, default=None,
                   help="step-matched runs: each stops after this many steps, the base's lr schedule kept")
    p.add_argument("--grad-var-every", type=int, default=2,
                   help="steps between gradient-variance measurements (0: none; they cost extra backward passes)")
    p.add_argument("--val-size", type=int, default=16)
    p.add_argument("--val-every", type=int, default=4)
    p.add_argument("--val-samples", type=int, default=2)
    p.add_argument("--final-eval", type=int, default=0, metavar="N",
                   help="evaluate each run's last checkpoint on the first N held-out problems (0: off)")
    p.add_argument("--final-eval-k", type=int, default=8, help="samples per problem of --final-eval")
    p.add_argument("--final-eval-backend", choices=("vllm", "hf"), default="vllm", help="engine of --final-eval")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each run's last checkpoint, <out>/runs/<arm>_s<seed>/checkpoints/last.ckpt (default: "
                        "none; with --final-eval it is deleted after the evaluation, ~1.6 GB for SmolLM2)")
    p.add_argument("--prompts-per-step", type=int, default=None, help="override data.prompts_per_step")
    p.add_argument("--out", default="results/compare")
    p.add_argument("--report-only", action="store_true", help="rebuild compare.md/png from summary.json")
    p.add_argument("--contrast", nargs=2, action="append", default=[], metavar=("ARM", "REFERENCE"),
                   help="report ARM - REFERENCE paired by seed (repeatable); default: each arm against its "
                        "gradient-variance baseline (gspo_large_group for IBPO arms)")
    args = p.parse_args(argv)
    if not args.report_only and args.budget_flops is None and args.budget_seconds is None and args.max_steps is None:
        p.error("give --budget-flops, --budget-seconds or --max-steps: the arms are matched on compute or steps")
    return args


def run(cmd: list[str], log_path: str) -> None:
    with open(log_path, "w") as log:
        result = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise SystemExit(f"command failed ({result.returncode}); see {log_path}: {' '.join(cmd)}")


def baseline_validation(base: dict, seed: int, settings: ArmSettings, out: str) -> float:
    """val/accuracy of the untrained model: the step-0 point every arm shares. Scored once per
    seed and comparison: a later call with the same config reads the first score back instead
    of spending a validation pass, and arms added later share the first arms' step-0 point."""
    root = os.path.join(out, "runs", f"baseline_s{seed}")
    os.makedirs(root, exist_ok=True)
    cfg = build_arm_config(base, "ibpo_plain", seed, settings, root)
    path = os.path.join(root, "config.yaml")
    with exclusive_lock(os.path.join(root, ".lock")):
        if os.path.exists(path):
            with open(path) as f:
                same = yaml.safe_load(f) == cfg
            try:
                scored = read_scalars(root, ["val/accuracy"]).get("val/accuracy") if same else None
            except FileNotFoundError:
                scored = None
            if scored:
                return scored[-1][1]
            shutil.rmtree(os.path.join(root, "lightning_logs"), ignore_errors=True)  # another config's score
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f, sort_keys=False)
        run([sys.executable, "-m", "ibpo_lit", "validate", "--config", path], os.path.join(root, "log.txt"))
        return read_scalars(root, ["val/accuracy"])["val/accuracy"][-1][1]


def untrained_evaluation(base: dict, settings: ArmSettings, args: argparse.Namespace, held_out: str) -> dict:
    """``--final-eval`` of the model every run starts from: once per comparison (seed 0), read
    back when a result for the same settings exists."""
    root = os.path.join(args.out, "runs", "baseline_eval")
    os.makedirs(root, exist_ok=True)
    output = os.path.join(root, f"n{args.final_eval}_k{args.final_eval_k}_{args.final_eval_backend}.json")
    with exclusive_lock(os.path.join(root, ".lock")):
        if not os.path.exists(output):
            cfg = build_arm_config(base, "ibpo_plain", 0, settings, root)
            run(final_eval.evaluate_command(cfg, None, held_out, args.final_eval, args.final_eval_k,
                                            args.final_eval_backend, seed=0, output=output), os.path.join(root, "log.txt"))
        return final_eval.read_result(output)


def evaluate_final_checkpoint(cfg: dict, root: str, seed: int, args: argparse.Namespace, held_out: str) -> dict:
    """``--final-eval`` of a finished run's last checkpoint; the checkpoint is deleted after
    unless ``--keep-checkpoints``."""
    ckpt = os.path.join(root, "checkpoints", "last.ckpt")
    if not os.path.exists(ckpt):
        raise SystemExit(f"--final-eval: the run left no checkpoint at {ckpt}; see {os.path.join(root, 'log.txt')}")
    output = os.path.join(root, "final_eval.json")
    run(final_eval.evaluate_command(cfg, ckpt, held_out, args.final_eval, args.final_eval_k, args.final_eval_backend,
                                    seed=seed, output=output), os.path.join(root, "final_eval_log.txt"))
    if not args.keep_checkpoints:
        os.remove(ckpt)
    return final_eval.read_result(output)


def train_and_evaluate(base: dict, arm: str, seed: int, settings: ArmSettings, args: argparse.Namespace,
                       root: str, baseline: float, held_out: Optional[str], summary_path: str,
                       argv) -> list[dict]:
    """One run: its config, the fit, its summary (and ``--final-eval``), recorded in
    ``summary.json``; returns the merged summaries."""
    cfg_path = os.path.join(root, "config.yaml")
    cfg = build_arm_config(base, arm, seed, settings, root)
    if held_out or args.keep_checkpoints:
        cfg["checkpoint"] = {"save_last": True, "save_top_k": 0}  # the final weights (for --final-eval)
    with open(cfg_path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    start = time.time()
    print(f"[compare] {arm} seed {seed} ...", flush=True)
    run([sys.executable, "-m", "ibpo_lit", "fit", "--config", cfg_path], os.path.join(root, "log.txt"))
    summary = summarize_run(root, arm, seed, baseline_val=baseline)
    summary["wall_seconds"] = time.time() - start
    summary["problem_seed"] = problem_seed(cfg)
    if held_out:
        summary.update(evaluate_final_checkpoint(cfg, root, seed, args, held_out))
        untrained = untrained_evaluation(base, settings, args, held_out)
        summary["baseline_eval"] = untrained["final_eval"]
    summary["command"] = " ".join(["python", "scripts/compare.py", *(argv or sys.argv[1:])])
    summaries = record_summary(summary_path, summary)
    print(f"[compare] {arm} seed {seed}: {summary['steps']} steps, final reward "
          f"{summary['final_reward']}, final val {summary['final_val']}", flush=True)
    return summaries


def problem_seed(cfg: dict) -> int:
    """The seed of the run's training problem stream: ``data.arithmetic.seed`` when the config
    sets it, else ``seed_everything``'s (the data module's rule, `ibpo_lit.seeds.stream_seed`)."""
    arithmetic = (cfg.get("data") or {}).get("arithmetic") or {}
    return stream_seed(arithmetic.get("seed"), run=cfg["seed_everything"])


def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    summary_path = os.path.join(args.out, "summary.json")
    summaries = load_summaries(summary_path)

    if not args.report_only:
        with open(args.base) as f:
            base = yaml.safe_load(f)
        if args.prompts_per_step:
            base.setdefault("data", {})["prompts_per_step"] = args.prompts_per_step
        settings = ArmSettings(
            small_group=args.small_group, budget_flops=args.budget_flops, budget_device_seconds=args.budget_seconds,
            val_size=args.val_size, val_every=args.val_every, val_samples=args.val_samples,
            grad_var_every=args.grad_var_every, max_steps=args.max_steps,
        )
        held_out = None
        if args.final_eval:
            held_out = os.path.join(args.out, f"held_out_{args.final_eval}.jsonl")
            final_eval.write_held_out(base, args.final_eval, held_out)
        done = {(s["arm"], s["seed"]) for s in summaries}
        for seed in args.seeds:
            if all((arm, seed) in done for arm in args.arms):
                continue
            baseline = baseline_validation(base, seed, settings, args.out)
            for arm in args.arms:
                summaries = load_summaries(summary_path)  # another process may have added runs
                done = {(s["arm"], s["seed"]) for s in summaries}
                if (arm, seed) in done:
                    continue
                ran = [s for s in summaries if s["seed"] == seed and not s.get("same_run_as")]
                twin = same_config_arm(base, arm, seed, settings, [s["arm"] for s in ran])
                if twin is not None:
                    # the same run under another name (e.g. lambda_0.6 = ibpo_plain): its result, not a rerun
                    summary = dict(next(s for s in ran if s["arm"] == twin), arm=arm, same_run_as=twin)
                    summaries = record_summary(summary_path, summary)
                    print(f"[compare] {arm} seed {seed}: same config as {twin}, its run is reused", flush=True)
                    continue
                root = os.path.join(args.out, "runs", f"{arm}_s{seed}")
                os.makedirs(root, exist_ok=True)
                with claim(os.path.join(root, ".claim")) as mine:
                    if not mine or (arm, seed) in {(s["arm"], s["seed"]) for s in load_summaries(summary_path)}:
                        # Two comparisons sharing --out (e.g. one per core) never train the same run.
                        print(f"[compare] {arm} seed {seed}: " + ("another process is running it, skipped" if not mine
                              else "finished by another process"), flush=True)
                        continue
                    summaries = train_and_evaluate(base, arm, seed, settings, args, root, baseline, held_out,
                                                   summary_path, argv)

    table = markdown_table(summaries)
    lines = [table, ""]
    arms = sorted({s["arm"] for s in summaries})
    # Each arm against its gradient-variance baseline, or the contrasts named with --contrast.
    contrasts = [tuple(c) for c in args.contrast] if args.contrast else [(a, GRAD_VAR_BASELINES.get(a)) for a in arms]
    for arm, baseline in contrasts:
        diff = paired_difference(summaries, arm, baseline) if baseline else None
        if diff:
            mean, low, high, seeds = diff
            lines.append(f"- val acc, end, {arm} - {baseline} (paired by seed; 95% paired t, n = {seeds} seeds): "
                         + interval_text(mean, low, high, "{:+.3f}"))
        ratio = gradient_variance_ratio(summaries, arm, baseline) if baseline else None
        if ratio:
            mean, low, high, seeds = ratio
            lines.append(f"- gradient-variance trace, {arm} / {baseline} (paired by seed; geometric mean, 95% t on "
                         f"the logs, n = {seeds} seeds): " + interval_text(mean, low, high, "{:.3f}"))
        line = final_eval_line(summaries, arm, baseline)
        if line:
            lines.append(line)
        if not args.contrast:
            line = final_eval_seeds_line(summaries, arm)
            if line:
                lines.append(line)
    if args.contrast:
        lines += [line for arm in arms if (line := final_eval_seeds_line(summaries, arm))]
    report = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "compare.md"), "w") as f:
        f.write(report)
    plot(summaries, os.path.join(args.out, "compare.png"))
    print(report)


def final_eval_line(summaries: list[dict], arm: str, baseline: str | None) -> str | None:
    """The ``--final-eval`` difference of ``arm`` to ``baseline``, paired by seed and problem."""
    if baseline is None:
        return None
    runs = [s for s in summaries if s["arm"] == arm]
    diff = final_eval.paired_difference(runs, [s for s in summaries if s["arm"] == baseline])
    if diff is None:
        return None
    mean, low, high, seeds = diff
    first = next(s for s in runs if s.get("final_eval_correct") is not None)
    return (f"- final validation, {arm} - {baseline} ({first['final_eval_problems']} problems x "
            f"{first['final_eval_k']} samples, {first['final_eval_backend']}; paired by seed and problem, 95% paired t "
            f"over the seeds, n = {seeds} seeds): " + interval_text(mean, low, high, "{:+.3f}"))


def final_eval_seeds_line(summaries: list[dict], arm: str) -> str | None:
    """Each seed's ``--final-eval`` accuracy with a 95% t-interval over the problems (the noise of
    one run's score; the spread between seeds is the comparison's)."""
    runs = sorted((s for s in summaries if s["arm"] == arm and s.get("final_eval_correct")), key=lambda s: s["seed"])
    if not runs:
        return None
    cells = []
    for run in runs:
        per_problem = [c / run["final_eval_k"] for c in run["final_eval_correct"]]
        cells.append(f"seed {run['seed']} " + interval_text(*t_interval(per_problem), "{:.3f}"))
    return (f"- final validation per seed, {arm} (95% t over the {len(runs[0]['final_eval_correct'])} problems): "
            + ", ".join(cells))


if __name__ == "__main__":
    main()
