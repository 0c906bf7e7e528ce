"""A comparison's validation with power: each run's last checkpoint evaluated on many held-out
problems x k samples by ``python -m ibpo_lit evaluate`` (vLLM by default), and the paired
difference between two arms, bootstrapped over seeds and problems at once.

Why beside the in-training validation: that one scores ``data.val_size`` x ``model.val_samples``
samples every few steps (16 x 2 in the A/B of docs/results.md), where a difference under about
0.1 is noise. Scoring 200 problems x 8 samples at every validation would cost more than the
training; scored once, on the final weights, with vLLM, it costs a few minutes per run.

What is covered:
- ``write_held_out(cfg, n, path)``: the first ``n`` problems of the run's held-out arithmetic
  stream (``arithmetic.held_out``: the stream validation scores, so its first ``data.val_size``
  problems are the in-training validation set) as GSM8K-format JSON Lines (``question``,
  ``answer`` "#### N"), the format ``evaluate --benchmark gsm8k --path`` reads.
- ``evaluate_command``: the evaluation with the run's own prompt (instruction, system prompt,
  prompt length limit) and its own sampling settings (``model.rollout.sampling``).
- ``read_result``: the summary fields, among them the number of correct samples per problem, so
  arms can be paired problem by problem.
- ``paired_difference``: mean over seeds and problems of ``arm - baseline`` accuracy, with a 95%
  paired t-interval over the seeds (each seed's difference is its mean over the problems).
  Why t over seeds and not a bootstrap of seeds and problems: with 3 seeds a bootstrap of seeds
  cannot reach past the smallest and largest seed's difference (its "95%" covers about 75%),
  and the spread between training runs, not the problems, is what bounds the result. The problem
  set is fixed and shared by every seed; the noise of its k samples is inside each seed's value.

What is not covered: runs on a file or a dataset (their ``data.val_path`` can be evaluated
directly with ``evaluate --path``); the error says so.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import numpy as np

from ibpo_lit.data.arithmetic import ArithmeticConfig, arithmetic_problem, held_out
from ibpo_lit.evaluation.bootstrap import t_interval
from ibpo_lit.rollout.engine import SamplingConfig

SUMMARY_KEYS = ("final_eval", "final_eval_correct", "final_eval_k", "final_eval_problems", "final_eval_backend",
                "final_eval_seconds")


def _arithmetic(cfg: dict) -> ArithmeticConfig:
    data = cfg.get("data") or {}
    if data.get("source", "arithmetic") != "arithmetic" or data.get("train_path") or data.get("val_path"):
        raise ValueError("--final-eval needs a run on synthetic arithmetic (data.source: arithmetic); for a run on "
                         "a file, evaluate its data.val_path with `python -m ibpo_lit evaluate --path`")
    if data.get("chat_template_kwargs"):
        raise ValueError("--final-eval: `evaluate` has no chat_template_kwargs, so it would not build this run's prompts")
    return ArithmeticConfig(**(data.get("arithmetic") or {}))


def write_held_out(cfg: dict, n: int, path: str) -> None:
    """The first ``n`` held-out problems of the run ``cfg`` as GSM8K-format JSON Lines."""
    if n < 1:
        raise ValueError(f"the final evaluation needs at least one problem, got {n}")
    stream = held_out(_arithmetic(cfg))
    with open(path, "w") as f:
        for i in range(n):
            text, gold = arithmetic_problem(i, stream)
            f.write(json.dumps({"question": text, "answer": f"#### {gold}"}) + "\n")


def evaluate_command(cfg: dict, ckpt_path: str | None, held_out_path: str, n: int, k: int, backend: str,
                     seed: int, output: str, batch_size: int = 32) -> list[str]:
    """``python -m ibpo_lit evaluate ...`` for the run ``cfg`` (its model, prompt and sampling);
    ``ckpt_path`` None evaluates the model the run starts from. ``batch_size`` problems per
    generate call: vLLM's throughput grows with the batch (each problem brings k rows)."""
    data, model = cfg.get("data") or {}, cfg["model"]
    sampling = SamplingConfig(**((model.get("rollout") or {}).get("sampling") or {}))
    cmd = [sys.executable, "-m", "ibpo_lit", "evaluate", "--model_name_or_path", str(model["model"]),
           "--benchmark", "gsm8k", "--path", held_out_path, "--limit", str(n), "--k", str(k),
           "--temperature", str(sampling.temperature), "--top_p", str(sampling.top_p), "--top_k", str(sampling.top_k),
           "--min_p", str(sampling.min_p), "--max_new_tokens", str(sampling.max_new_tokens),
           "--repetition_penalty", str(sampling.repetition_penalty),
           "--seed", str(seed), "--backend", backend, "--batch_size", str(batch_size), "--output", output]
    if data.get("instruction") is not None:
        cmd += ["--instruction", data["instruction"]]
    if data.get("system_prompt") is not None:
        cmd += ["--system_prompt", data["system_prompt"]]
    if data.get("max_prompt_tokens") is not None:
        cmd += ["--max_prompt_tokens", str(data["max_prompt_tokens"])]
    if ckpt_path is not None:
        cmd += ["--ckpt_path", ckpt_path]
    return cmd


def read_result(path: str) -> dict:
    """The summary fields of an evaluation's result JSON."""
    with open(path) as f:
        result = json.load(f)
    return {
        "final_eval": result["avg@k"],
        "final_eval_correct": [p["n_correct"] for p in result["problems"]],
        "final_eval_k": result["k"],
        "final_eval_problems": result["n_problems"],
        "final_eval_backend": result["backend"],
        "final_eval_seconds": result["seconds"],
    }


def paired_difference(runs: Sequence[dict], baseline_runs: Sequence[dict],
                      confidence: float = 0.95) -> tuple[float, float, float, int] | None:
    """``(mean, low, high, seeds)`` of the accuracy of ``runs`` minus that of ``baseline_runs``
    on the same problems, paired by seed and problem: each seed's mean difference over the
    problems, then a t-interval over the seeds (NaN bounds with one seed). None when no seed has
    both evaluations."""
    base = {r["seed"]: r for r in baseline_runs if r.get("final_eval_correct") is not None}
    per_seed = []
    for run in runs:
        other = base.get(run["seed"])
        if run.get("final_eval_correct") is None or other is None:
            continue
        if len(run["final_eval_correct"]) != len(other["final_eval_correct"]):
            raise ValueError(f"seed {run['seed']}: the arms were evaluated on different numbers of problems")
        diff = (np.asarray(run["final_eval_correct"]) / run["final_eval_k"]
                - np.asarray(other["final_eval_correct"]) / other["final_eval_k"])
        per_seed.append(float(diff.mean()))
    if not per_seed:
        return None
    return (*t_interval(per_seed, confidence), len(per_seed))
