"""The policy-gradient estimator's variance at fixed weights, per method (issue 21).

    python scripts/variance_at_fixed_policy.py --config configs/smollm2_135m_cpu.yaml \\
        --problems ../shared/data/gsm8k_train.jsonl --num_prompts 4 --batches 16 \\
        --methods gspo gspo_large_group ibpo_plain ibpo_ratio ibpo_mask gspo_ciw \\
        [--ckpt_path runs/x/checkpoints/last.ckpt] --out results/variance/untrained.json
    python scripts/variance_at_fixed_policy.py --report results/variance/untrained.json \
        [--out results/variance/untrained.json]     # recompute the statistics and intervals, and save them

For each method (an arm of ``ibpo_lit.experiments.arms``: GSPO at the small group G, GSPO at 4G,
IBPO plain/ratio/mask at G, GSPO + CIW at G) it runs the real training step on the same
``num_prompts`` problems ``batches`` times with different rollout seeds, at fixed weights (the
optimizer never steps), and records each prompt's part of the policy gradient on a parameter
subset (``--param_filter``): rollouts, verifier, corrections, shaping, advantages and CIW are
exactly what ``fit`` runs. ``ibpo_lit.experiments.variance`` turns the parts into the trace of the
gradient's covariance across batches, each batch's cosine to the other batches' mean and the
signal-to-noise, the trace at equal rows and equal compute (estimated FLOPs of generation,
corrections and one update), with 95% jackknife intervals over batches and prompts.

The weights are the config's model (untrained) or a checkpoint's policy (``--ckpt_path``). The
rollouts are sampled with the HF engine whatever the config says (the policy itself; no engine
to keep in sync).
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Optional

import torch
import yaml
from lightning.pytorch.callbacks import Callback

from ibpo_lit.algorithms.diagnostics import estimate_flops
from ibpo_lit.experiments.arms import ARMS, ArmSettings
from ibpo_lit.experiments.variance import jackknife_interval, snr_difference, summarize, summarize_grams, trace_ratio

DEFAULT_METHODS = ["gspo", "gspo_large_group", "ibpo_plain", "ibpo_ratio", "ibpo_mask", "gspo_ciw"]
# Callbacks that log, stop or measure on their own; the measurement needs none of them.
DROPPED_CALLBACKS = ("ComputeBudgetStopper", "GradientVarianceLogger", "RolloutSamples", "VLLMWeightSync")


class GradientParts(Callback):
    """At each step, after shaping and advantages, each prompt's part of the policy gradient on
    the chosen parameters (the batch's own loss denominators, so the parts sum to the batch's
    gradient), and the step's compute."""

    def __init__(self, param_filter: str, ckpt_path: Optional[str] = None) -> None:
        self.pattern = re.compile(param_filter)
        self.ckpt_path = ckpt_path
        self.parts: list[dict[str, torch.Tensor]] = []  # per batch: prompt uid -> [D]
        self.rows: list[int] = []
        self.flops: list[float] = []
        self.rollout_digests: list[str] = []  # per batch: which rollouts were sampled

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.ckpt_path is not None:
            from ibpo_lit.evaluation.checkpoint import load_checkpoint_weights

            load_checkpoint_weights(pl_module.policy, self.ckpt_path)

    def on_before_update(self, trainer, pl_module, step) -> None:
        update = step.update
        params = [p for name, p in pl_module.policy.named_parameters() if p.requires_grad and self.pattern.search(name)]
        if not params:
            raise ValueError(f"no trainable parameter matches --param_filter {self.pattern.pattern!r}")
        batch = update.batch
        # Rollout rows answer prompt group_index; correction rows are grouped by their prompt too
        # (algorithm.ibpo.grouping: prompt, the default), numbered after the rollouts'.
        n_rollouts = len(step.rollouts)
        prompt_of = batch.group_index.cpu()
        groups = [torch.nonzero(prompt_of == p).flatten() for p in range(len(step.prompts))]
        # the batch's own denominators: each prompt's part, the parts summing to the batch's gradient
        grads = pl_module.updater.group_gradients(update, groups, params, denominators="batch").cpu()
        parts = {prompt.uid: grads[p] for p, prompt in enumerate(step.prompts)}
        self.parts.append(parts)
        self.rows.append(len(batch))
        # Methods at the same G sample the same rollouts in batch m (the seeds are a function of
        # seed, step and row): the digest shows it; the ratios' intervals, paired by batch, rely on it.
        tokens = step.rollouts.response_ids.cpu().numpy().tobytes()
        self.rollout_digests.append(hashlib.sha1(tokens).hexdigest()[:12])
        corrections = step.corrections
        lengths = batch.prompt_mask.sum(dim=1) + batch.response_mask.sum(dim=1)
        self.flops.append(estimate_flops(
            sum(x.numel() for x in pl_module.policy.parameters()),
            prompt_tokens=int(step.rollouts.prompt_mask.sum()) + (corrections.prompt_tokens if corrections else 0),
            generated_tokens=int(step.rollouts.response_mask[:n_rollouts].sum())
            + (corrections.generated_tokens if corrections else 0),
            trained_tokens=int(lengths.sum()),
        )["total"])


def method_config(base: dict, method: str, group: int, problems: str, num_prompts: int, batches: int,
                  root: str) -> dict:
    """``base`` turned into ``method``'s arm, measuring ``batches`` steps of ``num_prompts`` prompts."""
    cfg = ARMS[method](copy.deepcopy(base), ArmSettings(small_group=group))
    trainer = cfg.setdefault("trainer", {})
    trainer.update({"default_root_dir": root, "logger": False, "enable_progress_bar": False,
                    "max_epochs": 1, "max_steps": -1, "limit_train_batches": batches,
                    "limit_val_batches": 0, "num_sanity_val_steps": 0})
    trainer["callbacks"] = [cb for cb in trainer.get("callbacks", [])
                            if not any(cb.get("class_path", "").endswith(name) for name in DROPPED_CALLBACKS)]
    cfg["checkpoint"] = {"save_last": False, "save_top_k": 0}
    model = cfg.setdefault("model", {})
    model.setdefault("optim", {})["total_steps"] = 1  # the schedule needs a length; nothing steps
    model.setdefault("rollout", {})["backend"] = "hf"
    model["rollout"]["num_mini_batches"] = 1
    data = cfg.setdefault("data", {})
    for key in ("code_format", "code_split", "code_val_split", "val_path"):
        data.pop(key, None)
    data.update({"source": "jsonl", "train_path": problems, "prompts_per_step": num_prompts, "val_size": 0})
    return cfg


def measure(base: dict, method: str, args, root: str) -> dict:
    """One method's gradient parts at fixed weights, summarised."""
    from ibpo_lit.__main__ import main

    os.makedirs(root, exist_ok=True)
    cfg = method_config(base, method, args.group_size, args.problems_file, args.num_prompts, args.batches, root)
    path = os.path.join(root, f"{method}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        cli = main(["--config", path], run=False)
    finally:
        sys.argv = argv
    collector = GradientParts(args.param_filter, args.ckpt_path)
    cli.trainer.callbacks.append(collector)
    cli.model.updater.run = lambda *a, **k: {}  # fixed weights: the optimizer never steps
    start = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    seconds = time.perf_counter() - start
    uids = sorted(collector.parts[0])
    if any(sorted(p) != uids for p in collector.parts):
        raise RuntimeError("the batches did not all hold the same prompts")
    parts = torch.stack([torch.stack([batch[u] for u in uids]) for batch in collector.parts])  # [M, P, D]
    out = summarize(parts, sum(collector.rows) / len(collector.rows), sum(collector.flops) / len(collector.flops))
    out.update({"method": method, "prompt_ids": [str(u) for u in uids], "rollout_digests": collector.rollout_digests,
                "seconds_per_batch": seconds / len(collector.parts),
                "group_size": cli.model.rollout_cfg.group_size})
    return out


def write_problems(path: str, num_prompts: int, offset: int, repeat: bool) -> str:
    """The first ``num_prompts`` records of ``path`` from ``offset`` (or the record at ``offset``
    ``num_prompts`` times: identical prompts, i.i.d. groups) into a file of their own."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    chosen = [lines[offset]] * num_prompts if repeat else lines[offset: offset + num_prompts]
    if len(chosen) < num_prompts:
        raise ValueError(f"{path} has fewer than {offset + num_prompts} records")
    # One file name whatever the run: prompt ids (name:line) then match between saved runs.
    out = os.path.join(tempfile.mkdtemp(prefix="ibpo_variance_"), "problems.jsonl")
    with open(out, "w") as f:
        f.writelines(line if line.endswith("\n") else line + "\n" for line in chosen)
    return out


def comparison(results: dict[str, dict], baseline: str) -> dict[str, dict]:
    """Each method against ``baseline``: trace ratios at equal batches, equal rows, equal FLOPs,
    and the difference in signal-to-noise, with 95% jackknife intervals paired by prompt and by
    batch (``jackknife_interval``: the same batch and prompt left out of both; batch m of every
    method samples with the same rollout seeds) when both measured the same prompts."""
    if baseline not in results:
        return {}
    ref = results[baseline]
    if ref["trace_cov"] <= 0:
        return {}
    out = {}
    for m, r in results.items():
        row = {"trace_ratio": r["trace_cov"] / ref["trace_cov"],
               "trace_ratio_equal_rows": r["trace_cov_x_rows"] / ref["trace_cov_x_rows"],
               "trace_ratio_equal_flops": r["trace_cov_x_flops"] / ref["trace_cov_x_flops"],
               "cosine_minus_baseline": r["cosine_to_mean"] - ref["cosine_to_mean"],
               "snr_minus_baseline": r["signal_to_noise"] - ref["signal_to_noise"]}
        if r["prompt_ids"] == ref["prompt_ids"]:
            cross, ref_cross = torch.tensor(r["prompt_cross_grams"]), torch.tensor(ref["prompt_cross_grams"])
            row["snr_minus_baseline_ci"] = list(jackknife_interval(snr_difference, [cross, ref_cross])[1:])
            _, lo, hi = jackknife_interval(trace_ratio, [cross, ref_cross], log=True)
            # Rows and FLOPs per batch are each method's means: constants that scale the interval.
            for key, scale in (("trace_ratio", 1.0),
                               ("trace_ratio_equal_rows", r["rows_per_batch"] / ref["rows_per_batch"]),
                               ("trace_ratio_equal_flops", r["flops_per_batch"] / ref["flops_per_batch"])):
                row[key + "_ci"] = [lo * scale, hi * scale]
        out[m] = row
    return out


def _compact_json(obj) -> str:
    """Indented JSON with each innermost list of numbers on one line: the Gram matrices hold
    P*P*M*M numbers per method, one per line would bury the summaries. (A newline never occurs
    inside a JSON string, so the pattern, which starts at one, touches lists only.)"""
    return re.sub(r"\[\n\s+([-+0-9.eE,\s]+?)\n\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]",
                  json.dumps(obj, indent=1))


def _ratio(q: dict, key: str, sign: str = "") -> str:
    ci = q.get(key + "_ci")
    return f"{q[key]:{sign}.2f}" + (f" [{ci[0]:{sign}.2f}, {ci[1]:{sign}.2f}]" if ci else "")


def markdown(results: dict[str, dict], ratios: dict[str, dict], baseline: str = "gspo") -> str:
    head = (f"| method | G | rows | trace Cov [95% CI] | cross-prompt share | / {baseline}, per batch "
            f"| / {baseline}, equal rows | / {baseline}, equal FLOPs | cosine to mean [95% CI] | signal/noise [95% CI] "
            f"| signal/noise - {baseline} | TFLOP/batch | s/batch |")
    lines = [head, "|" + " --- |" * 13]
    for m, r in results.items():
        q = ratios.get(m)
        vs = " | ".join(_ratio(q, k) for k in ("trace_ratio", "trace_ratio_equal_rows", "trace_ratio_equal_flops")) \
            if q else "- | - | -"
        lines.append(f"| {m} | {r['group_size']} | {r['rows_per_batch']:.0f} | {r['trace_cov']:.3g} "
                     f"[{r['trace_cov_ci'][0]:.3g}, {r['trace_cov_ci'][1]:.3g}] | {r['cross_prompt_share']:+.0%} "
                     f"| {vs} | {r['cosine_to_mean']:.3f} "
                     f"[{r['cosine_to_mean_ci'][0]:.3f}, {r['cosine_to_mean_ci'][1]:.3f}] "
                     f"| {_ratio(r, 'signal_to_noise')} | {_ratio(q, 'snr_minus_baseline', '+') if q else '-'} "
                     f"| {r['flops_per_batch'] / 1e12:.2f} | {r['seconds_per_batch']:.1f} |")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="base fit config (model, decoding, IBPO settings)")
    parser.add_argument("--problems", help="JSONL problems in the config's data fields")
    parser.add_argument("--report", metavar="JSON", default=None,
                        help="measure nothing: print the table of a saved --out file, every statistic and interval "
                             "recomputed from its cross Grams (with --out: saved there, the measurements unchanged)")
    parser.add_argument("--num_prompts", type=int, default=4)
    parser.add_argument("--offset", type=int, default=0, help="first record of --problems used")
    parser.add_argument("--repeat_one", action="store_true",
                        help="use the record at --offset num_prompts times (identical prompts: i.i.d. groups)")
    parser.add_argument("--batches", type=int, default=16, help="M: independent rollout batches per method")
    parser.add_argument("--group_size", type=int, default=8, help="G of the small-group methods (GSPO large: 4G)")
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=sorted(ARMS))
    parser.add_argument("--baseline", default="gspo", help="the method the others are compared with")
    parser.add_argument("--param_filter", default=r"layers\.0\.self_attn\.(q|v)_proj",
                        help="regex of the parameters whose gradient is measured")
    parser.add_argument("--ckpt_path", default=None, help="a checkpoint whose policy weights are measured")
    parser.add_argument("--out", default=None, help="write the results JSON here")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="dotted config keys set on the base, e.g. model.rollout.sampling.max_new_tokens=64")
    args = parser.parse_args(argv)
    if args.report is None and (args.config is None or args.problems is None):
        parser.error("--config and --problems are required (or --report JSON)")
    return args


def recomputed(saved: dict) -> dict:
    """A saved run with every statistic and interval recomputed from its cross Grams (what was
    measured: Grams, rows, FLOPs, prompts, digests, seconds, stays as it was)."""
    if any("prompt_cross_grams" not in r for r in saved["results"].values()):
        raise SystemExit("the file was written by an older version of this script (no prompt_cross_grams, "
                         "which the intervals need): measure it again")
    results = {}
    for method, r in saved["results"].items():
        stats = summarize_grams(torch.tensor(r["prompt_cross_grams"]), r["rows_per_batch"], r["flops_per_batch"])
        results[method] = {**{k: v for k, v in r.items() if k != "prompt_cross_grams"}, **stats,
                           "prompt_cross_grams": r["prompt_cross_grams"]}
    # n_resamples and seed were the bootstrap's, which the jackknife replaced
    settings = {k: v for k, v in saved["settings"].items() if k not in ("n_resamples", "seed")}
    return {**saved, "settings": settings, "results": results,
            "vs_baseline": comparison(results, settings["baseline"]),
            "statistics": "recomputed from the cross Grams by `--report`: 95% delete-one jackknife intervals "
                          "(ibpo_lit/experiments/variance.py)"}


def report_table(path: str, out: Optional[str] = None) -> str:
    """The table of a saved run, every statistic and interval recomputed; saved to ``out`` when given."""
    with open(path) as f:
        saved = json.load(f)
    try:
        report = recomputed(saved)
    except SystemExit as e:
        raise SystemExit(f"{path}: {e}") from None
    if out:
        with open(out, "w") as f:
            f.write(_compact_json(report))
    return markdown(report["results"], report["vs_baseline"], report["settings"]["baseline"])


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    if args.report is not None:
        table = report_table(args.report, args.out)
        print(table)
        return {"table": table}
    if args.batches < 2:
        raise SystemExit("--batches must be >= 2 (a covariance needs two batches)")
    with open(args.config) as f:
        base = yaml.safe_load(f)
    for item in args.overrides:
        key, _, value = item.partition("=")
        node = base
        *parents, leaf = key.split(".")
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = yaml.safe_load(value)
    args.problems_file = write_problems(args.problems, args.num_prompts, args.offset, args.repeat_one)
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="ibpo_variance_runs_") as root:
            for method in args.methods:
                results[method] = measure(base, method, args, os.path.join(root, method))
                print(f"[variance] {method}: {args.batches} batches, "
                      f"{results[method]['seconds_per_batch']:.1f} s each", flush=True)
    finally:
        shutil.rmtree(os.path.dirname(args.problems_file))
    ratios = comparison(results, args.baseline)
    report = {"command": " ".join(["python", "scripts/variance_at_fixed_policy.py", *(argv or sys.argv[1:])]),
              "settings": {k: v for k, v in vars(args).items() if k != "problems_file"},
              "results": results, "vs_baseline": ratios}
    print(markdown(results, ratios, args.baseline))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(_compact_json(report))
    return report


if __name__ == "__main__":
    main()
