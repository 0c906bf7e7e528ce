"""The measurements of ``scripts/exact_gradient.py``, as functions that return JSON-ready dicts.

- ``policy_states``: the weights the fixed-policy measurements are taken at: the initial
  policy and the first GSPO iterate (seed 0) whose J reaches each level;
- ``measure_state``: every method's statistics at one state (``measure.bootstrap``), its
  cost, its corrections, its ratios to the paired baseline (GSPO, same G, same rollouts) with
  intervals, at equal samples (per draw) and at equal cost (variance x sequences), and, where
  it exists, the cosine of its mean to the shaped objective's exact gradient (``shaped``);
- ``run_curves`` / ``summarize_curves``: learning curves over seeds and their summaries, paired
  by seed with the configuration's baseline.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Optional

import torch

from ibpo_lit.evaluation.bootstrap import bootstrap_ci
from ibpo_lit.experiments.exact_gradient.estimators import Method, draw_loss
from ibpo_lit.experiments.exact_gradient.measure import (
    bootstrap,
    cosine,
    draw_generators,
    first_reaching,
    gradient_draws,
    interval,
    learning_curve,
    value_at_budget,
)
from ibpo_lit.experiments.exact_gradient.policy import TinyPolicy, exact_gradient, exact_objective
from ibpo_lit.experiments.exact_gradient.problem import Problem
from ibpo_lit.experiments.exact_gradient.shaped import expected_delta, shaped_gradient

RATIO_STATS = ("trace", "rel_var", "rel_mse", "snr", "cos_draw")


def policy_states(problem: Problem, levels: list[float], lr: float = 0.01, seed: int = 0,
                  max_steps: int = 2000, hidden: int = 64) -> dict[str, TinyPolicy]:
    """``{"init": policy, "J>=0.5": policy, ...}``: GSPO (G = 8) from ``seed``'s weights."""
    policy = TinyPolicy(problem, hidden=hidden, seed=seed)
    states = {"init": _copy(policy)}
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    pending = sorted(levels)
    for step in range(max_steps):
        if not pending:
            break
        table = policy.log_table().detach()
        objective = float(exact_objective(problem, table)[0])
        while pending and objective >= pending[0]:
            states[f"J>={pending.pop(0)}"] = _copy(policy)
        loss, _, _ = draw_loss(Method("gspo"), policy, table, *draw_generators(10_000 + seed, step))
        optimizer.zero_grad(set_to_none=True)
        if loss.requires_grad:
            loss.backward()
            optimizer.step()
    if pending:
        raise RuntimeError(f"GSPO did not reach J >= {pending[0]} in {max_steps} steps")
    return states


def _copy(policy: TinyPolicy) -> TinyPolicy:
    out = TinyPolicy(policy.problem, hidden=policy.net[0].out_features)
    out.load_state_dict(policy.state_dict())
    return out


def state_summary(policy: TinyPolicy) -> dict:
    objective, accuracy = exact_objective(policy.problem, policy.log_table().detach())
    return {"J": float(objective), "accuracy": [round(float(a), 4) for a in accuracy],
            "true_grad_norm": float(exact_gradient(policy).norm())}


def _method_settings(method: Method) -> dict:
    out = asdict(method)
    out["ciw"] = method.ciw is not None
    return out


def measure_state(methods: list[Method], policy: TinyPolicy, draws: int, seed: int = 0, baseline: str = "gspo",
                  resamples: int = 1000, shaped_samples: int = 32) -> list[dict]:
    """One row per method (see the module docstring); ``baseline`` must be among ``methods``."""
    true = exact_gradient(policy).detach()
    rows, reps = [], {}
    for method in methods:
        start = time.perf_counter()
        grads, infos = gradient_draws(method, policy, draws, seed)
        seconds = time.perf_counter() - start
        point, samples = bootstrap(grads, true, resamples=resamples, seed=seed)
        reps[method.name] = samples
        corrections = sum(i.corrections for i in infos)
        firsts = corrections / method.corrections_per_input
        row = {
            "method": method.name,
            "settings": _method_settings(method),
            "draws": draws,
            "sequences": sum(i.sequences for i in infos) / draws,
            "context_tokens": sum(i.context_tokens for i in infos) / draws,
            "seconds_per_draw": seconds / draws,
            "reward_mean": sum(i.reward_mean for i in infos) / draws,
            "correction_success": sum(i.successes for i in infos) / firsts if firsts else math.nan,
            "shaped_frac": sum(i.shaped for i in infos) / sum(i.sequences - i.corrections for i in infos),
            "rewrite_frac": (sum(i.rewrites for i in infos) / max(sum(i.successes for i in infos), 1)
                             if corrections else math.nan),
            "cov_y_phi": _nanmean([i.cov_y_phi for i in infos]),
            "stats": point,
            "ci": {k: interval(v) for k, v in samples.items()},
            "cos_shaped": math.nan,
            "cos_shaped_true": math.nan,
        }
        if method.variant in ("plain", "ratio") and method.alpha != "adaptive" and method.ciw is None:
            delta = expected_delta(method, policy, shaped_samples, torch.Generator().manual_seed(seed))
            shaped = shaped_gradient(policy, method.lam, delta).detach()
            row["cos_shaped"] = cosine(grads.mean(0), shaped)
            row["cos_shaped_true"] = cosine(shaped, true)
        rows.append(row)
    base_row = next(r for r in rows if r["method"] == baseline)
    base = reps[baseline]
    for row in rows:
        cost = row["sequences"] / base_row["sequences"]
        row["cost_ratio"] = cost
        ratios = {}
        for stat in RATIO_STATS:
            rep = reps[row["method"]][stat] / base[stat]
            ratios[stat] = [row["stats"][stat] / base_row["stats"][stat], *interval(rep)]
        s, b = reps[row["method"]], base
        rep_var_cost = s["rel_var"] * cost / b["rel_var"]
        rep_mse_cost = (s["rel_bias2"] + s["rel_var"] * cost) / b["rel_mse"]
        st, bs = row["stats"], base_row["stats"]
        ratios["rel_var_cost"] = [st["rel_var"] * cost / bs["rel_var"], *interval(rep_var_cost)]
        ratios["rel_mse_cost"] = [(st["rel_bias2"] + st["rel_var"] * cost) / bs["rel_mse"], *interval(rep_mse_cost)]
        row["vs_" + baseline] = ratios
    return rows


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


# ---------------------------------------------------------------------- learning curves
def run_curves(configs: list[dict], seeds: int, steps: int, log=None) -> list[dict]:
    """``configs``: dicts with ``label``, ``method`` (a Method), ``problem`` (a Problem), ``lr``
    and ``baseline`` (the label it is paired with). One run per (config, seed)."""
    runs = []
    for config in configs:
        start = time.perf_counter()
        for seed in range(seeds):
            out = learning_curve(config["method"], config["problem"], seed, config["lr"], steps)
            runs.append({"label": config["label"], "seed": seed, **out})
        if log is not None:
            log(f"curves {config['label']}: {seeds} seeds in {time.perf_counter() - start:.0f}s")
    return runs


def config_record(config: dict) -> dict:
    return {"label": config["label"], "baseline": config["baseline"], "lr": config["lr"],
            "problem": {"num_prompts": config["problem"].num_prompts, "length": config["problem"].length,
                        "vocab": config["problem"].vocab, "seed": config["problem"].seed},
            "method": _method_settings(config["method"])}


COLLAPSED = 0.05  # a prompt whose accuracy ends below this has collapsed onto wrong answers


def summarize_curves(configs: list[dict], runs: list[dict], targets=(0.8, 0.9), at_steps=(25, 50, 100, 150),
                     budgets=(2000, 4000, 8000)) -> list[dict]:
    """Per config: for each target, the seeds that reached it, the mean steps and sequences to
    it (a seed that never does counts as the last step + 1 and its sequences by then: a
    restricted mean, optimistic for the methods that stall), and the paired difference to
    the baseline (same seed) with a 95% bootstrap CI over seeds; J at fixed steps and at fixed
    sequence budgets, with their paired differences; the prompts collapsed at the end (accuracy
    below ``COLLAPSED``) and their paired difference. ``configs`` need only ``label`` and
    ``baseline``, so one set of runs can be compared with several baselines."""
    by_label: dict[str, dict[int, dict]] = {}
    for run in runs:
        by_label.setdefault(run["label"], {})[run["seed"]] = run
    out = []
    for config in configs:
        mine, base = by_label[config["label"]], by_label[config["baseline"]]
        seeds = sorted(set(mine) & set(base))
        record = {"label": config["label"], "baseline": config["baseline"], "seeds": len(seeds),
                  "sequences_per_step": _mean([mine[s]["sequences"][-1] / (len(mine[s]["curve"]) - 1) for s in seeds])}
        for target in targets:
            steps = {s: _censored_steps(mine[s], target) for s in seeds}
            base_steps = {s: _censored_steps(base[s], target) for s in seeds}
            record[f"target_{target}"] = {
                "reached": sum(first_reaching(mine[s]["curve"], target) is not None for s in seeds),
                "steps": _ci([steps[s][0] for s in seeds]),
                "sequences": _ci([steps[s][1] for s in seeds]),
                "steps_diff": _ci([steps[s][0] - base_steps[s][0] for s in seeds]),
                "sequences_diff": _ci([steps[s][1] - base_steps[s][1] for s in seeds]),
            }
        record["J_at_step"] = {str(k): {"value": _ci([mine[s]["curve"][k] for s in seeds]),
                                        "diff": _ci([mine[s]["curve"][k] - base[s]["curve"][k] for s in seeds])}
                               for k in at_steps if k < len(mine[seeds[0]]["curve"])}
        record["J_at_sequences"] = {
            str(b): {"value": _ci([value_at_budget(mine[s]["curve"], mine[s]["sequences"], b) for s in seeds]),
                     "diff": _ci([value_at_budget(mine[s]["curve"], mine[s]["sequences"], b)
                                  - value_at_budget(base[s]["curve"], base[s]["sequences"], b) for s in seeds])}
            for b in budgets}
        collapsed = {s: sum(a < COLLAPSED for a in mine[s]["final_accuracy"]) for s in seeds}
        base_collapsed = {s: sum(a < COLLAPSED for a in base[s]["final_accuracy"]) for s in seeds}
        record["collapsed_prompts"] = {"value": _ci([collapsed[s] for s in seeds]),
                                       "diff": _ci([collapsed[s] - base_collapsed[s] for s in seeds])}
        out.append(record)
    return out


def _censored_steps(run: dict, target: float) -> tuple[int, int]:
    index = first_reaching(run["curve"], target)
    if index is None:
        return len(run["curve"]), run["sequences"][-1]
    return index, run["sequences"][index]


def _ci(values: list[float]) -> list[float]:
    return list(bootstrap_ci(values, n_resamples=2000))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def mean_curve(runs: list[dict], label: str) -> Optional[list[float]]:
    curves = [r["curve"] for r in runs if r["label"] == label]
    return [sum(c[i] for c in curves) / len(curves) for i in range(len(curves[0]))] if curves else None
