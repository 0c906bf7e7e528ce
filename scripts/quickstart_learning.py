"""Does README's first command make the model better? Its fit, run with seeds chosen beforehand,
each run's last checkpoint scored on held-out problems against the untrained model.

    python scripts/quickstart_learning.py --seeds 1 2 3 --out results/quickstart_learning/default
    python scripts/quickstart_learning.py --seeds 1 2 3 --out results/quickstart_learning/lr1e-5 \\
        -- --model.optim.lr 1e-5                     # fit overrides after --

For each seed ``S``: ``python -m ibpo_lit fit --config configs/smollm2_135m_cpu.yaml
--seed_everything S`` (README's first command, plus ``--`` overrides) into ``OUT/runs/seedS``;
then ``python -m ibpo_lit evaluate`` of its last checkpoint on the first ``--problems`` problems of
the config's held-out arithmetic stream (the same for every seed; ``results/
compare_smollm2_power2/held_out_250.jsonl`` holds the first 250) x ``--k`` samples, with the run's
own prompt and sampling (`ibpo_lit.experiments.final_eval`), vLLM by default; the untrained model
once, on the same problems and evaluation seed, so every model is scored on the same sampling
seeds and problems and the differences pair problem by problem.

Judged by issue 43 item 9's three criteria, decided on held-out problems rather than on the
per-step training reward (4 prompts a step: about +-0.07):
- every seed's avg@k is above the untrained model's;
- the mean over seeds is at least ``--min-gain`` (0.03) above it;
- no run's mean response length at its last step is below half of its first step's (a policy
  that learns to answer in a few tokens has collapsed, whatever its reward).

Writes ``OUT/summary.json`` (every run's per-step reward and response length, its avg@k and
per-problem correct counts, the criteria, the command, the date, the commit and the CPU) and
``OUT/summary.md``. Resumable: a seed whose evaluation exists is not run again, a fit whose last
step's checkpoint exists is not trained again (a cut fit starts over).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import statistics
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CONFIG = "configs/smollm2_135m_cpu.yaml"


def _fit(seed: int, root: Path, overrides: list[str], threads: int | None) -> None:
    cmd = [sys.executable, "-m", "ibpo_lit", "fit", "--config", CONFIG, "--seed_everything", str(seed),
           "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false", *overrides]
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "fit.log", "w") as log:
        subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)


def _finished(ckpt: Path, cfg: dict) -> bool:
    """Whether ``ckpt`` holds the fit's last step (last.ckpt is also written every few steps)."""
    if not ckpt.exists():
        return False
    import torch

    return torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] >= cfg["trainer"]["max_steps"]


def _scalars(root: Path) -> dict[str, list[float]]:
    """Per-step training scalars of the run's (last) TensorBoard version."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    versions = sorted(glob.glob(str(root / "lightning_logs" / "version_*")))
    acc = EventAccumulator(versions[-1])
    acc.Reload()
    tags = acc.Tags()["scalars"]
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in ("train/reward", "train/response_len") if tag in tags}


def _evaluate(cfg: dict, ckpt: str | None, held_out: Path, args, output: Path, threads: int | None) -> dict:
    from ibpo_lit.experiments.final_eval import evaluate_command, read_result

    if not output.exists():
        cmd = evaluate_command(cfg, ckpt, str(held_out), args.problems, args.k, args.backend, args.eval_seed,
                               str(output))
        env = dict(os.environ)
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        with open(output.with_suffix(".log"), "w") as log:
            subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return read_result(str(output))


def criteria(untrained: float, runs: dict[int, dict], min_gain: float) -> dict:
    """Issue 43 item 9's three verdicts, and the numbers they rest on."""
    scores = [r["avg_at_k"] for r in runs.values()]
    mean = statistics.fmean(scores) if scores else float("nan")
    ratios = {seed: r["response_len"][-1] / r["response_len"][0] for seed, r in runs.items()}
    return {
        "every_seed_above_untrained": all(s > untrained for s in scores),
        "mean_gain": mean - untrained,
        "mean_gain_at_least": min_gain,
        "mean_gain_ok": mean - untrained >= min_gain,
        "response_len_last_over_first": ratios,
        "no_length_collapse": all(v >= 0.5 for v in ratios.values()),
    }


def _render(summary: dict) -> str:
    c = summary["criteria"]
    lines = [f"# Quick start, held-out check: `{summary['name']}`", "",
             f"`{summary['command']}` (fit overrides: `{' '.join(summary['overrides']) or 'none'}`), "
             f"{summary['date']}, commit {summary['commit']}, {summary['cpu']}.", "",
             f"Held out: the first {summary['problems']} problems of the config's held-out stream x "
             f"{summary['k']} samples ({summary['backend']}, evaluation seed {summary['eval_seed']}).", "",
             "| model | avg@k | response length, first step -> last | rewards per step |", "| --- | --- | --- | --- |",
             f"| untrained | {summary['untrained']['avg_at_k']:.3f} | | |"]
    for seed, r in sorted(summary["runs"].items(), key=lambda kv: int(kv[0])):
        lens = r["response_len"]
        rewards = " ".join(f"{x:.2f}" for x in r["reward"])
        lines.append(f"| seed {seed} | {r['avg_at_k']:.3f} | {lens[0]:.1f} -> {lens[-1]:.1f} | {rewards} |")
    lines += ["", f"- Every seed above the untrained model: **{c['every_seed_above_untrained']}**",
              f"- Mean gain {c['mean_gain']:+.3f} (needs >= {c['mean_gain_at_least']}): **{c['mean_gain_ok']}**",
              f"- No run's last response length below half its first: **{c['no_length_collapse']}**", ""]
    return "\n".join(lines)


def _cpu() -> str:
    import torch

    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    return f"{os.cpu_count()} cores, {torch.backends.cpu.get_cpu_capability()}, native bf16: {bf16}"


def main() -> None:
    argv = sys.argv[1:]
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="chosen before the runs")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--eval-seed", type=int, default=0, help="the evaluation's sampling seed, every model alike")
    parser.add_argument("--backend", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--min-gain", type=float, default=0.03)
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each fit and evaluation")
    args = parser.parse_args(argv)

    import yaml

    from ibpo_lit.experiments.final_eval import write_held_out

    cfg = yaml.safe_load((REPO / CONFIG).read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    held_out = args.out / f"held_out_{args.problems}.jsonl"
    write_held_out(cfg, args.problems, str(held_out))
    untrained = _evaluate(cfg, None, held_out, args, args.out / "eval_untrained.json", args.threads)
    runs = {}
    for seed in args.seeds:
        root = args.out / "runs" / f"seed{seed}"
        ckpt = root / "checkpoints" / "last.ckpt"
        if not (args.out / f"eval_seed{seed}.json").exists() and not _finished(ckpt, cfg):
            shutil.rmtree(root, ignore_errors=True)  # a cut run starts over: its curves stay whole
            _fit(seed, root, overrides, args.threads)
        result = _evaluate(cfg, str(ckpt), held_out, args, args.out / f"eval_seed{seed}.json", args.threads)
        scalars = _scalars(root)
        runs[seed] = {"avg_at_k": result["final_eval"], "correct": result["final_eval_correct"],
                      "reward": scalars.get("train/reward", []), "response_len": scalars.get("train/response_len", []),
                      "eval_seconds": result["final_eval_seconds"]}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    summary = {
        "name": args.out.name, "command": f"python -m ibpo_lit fit --config {CONFIG} --seed_everything S",
        "overrides": overrides, "seeds": args.seeds, "problems": args.problems, "k": args.k,
        "eval_seed": args.eval_seed, "backend": args.backend, "date": datetime.date.today().isoformat(),
        "commit": commit, "cpu": _cpu(),
        "untrained": {"avg_at_k": untrained["final_eval"], "correct": untrained["final_eval_correct"]},
        "runs": runs, "criteria": criteria(untrained["final_eval"], runs, args.min_gain),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "summary.md").write_text(_render(summary))
    print(_render(summary))


if __name__ == "__main__":
    main()
