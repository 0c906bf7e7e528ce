"""Bias, variance, MSE and cosine of an estimator at a fixed policy; learning curves.

At fixed weights, ``gradient_draws`` takes M independent draws of a method's gradient
estimate ``g_m`` (draw m's rollouts come from seed (seed, m), its corrections from a separate
stream, so every method with the same G sees the *same* rollouts: comparisons are paired).
``estimator_stats`` compares them with the exact gradient ``g* = grad J``:

- ``trace``: ``tr Cov(g)`` (unbiased over M), the raw variance the paper's ~30% is about;
- ``snr``: ``(|mean|^2 - trace / M) / trace``, signal over noise, blind to the scale;
- ``cos_mean``: cosine of the mean estimate with ``g*`` (1 = no bias in direction);
  ``cos_draw``: the mean over draws of ``cos(g_m, g*)``, what one step sees;
- calibrated to ``g*``: every method's loss has its own scale (group std, the rows IBPO's
  corrections add to the denominator), which an optimizer's step size absorbs. With
  ``c = |g*|^2 / (mean . g*)`` (so that ``c * E g`` projects onto ``g*`` exactly),
  ``rel_var = c^2 trace / |g*|^2``, ``rel_bias2 = (|c mean - g*|^2 - c^2 trace / M) / |g*|^2``
  (the part of the bias orthogonal to g*, the 1/M noise of ``|mean - g*|^2`` taken off; it may
  come out slightly negative when the bias is below the noise) and
  ``rel_mse = rel_bias2 + rel_var``, all relative to ``|g*|^2``;
- equal cost: a method whose draw generates ``k`` times the sequences of the baseline's
  averages ``1/k`` as many draws for the same budget, so its variance is multiplied by ``k``:
  ``rel_var_cost = rel_var * cost / cost_base`` and ``rel_mse_cost = rel_bias2 + rel_var_cost``.

``bootstrap`` gives percentile intervals over draws, paired with a baseline's draws (the same
resampled indices for both) for ratios.

``learning_curve`` trains a fresh policy (its seed: the weights, the rollouts) with Adam for a
number of steps, recording the exact ``J`` and the generated sequences at every step.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ibpo_lit.experiments.exact_gradient.estimators import Method, draw_loss
from ibpo_lit.experiments.exact_gradient.policy import TinyPolicy, exact_objective, flat_grad
from ibpo_lit.experiments.exact_gradient.problem import Problem


def draw_generators(seed: int, draw: int) -> tuple[torch.Generator, torch.Generator]:
    """(rollouts, corrections) generators of one draw: a pure function of (seed, draw)."""
    base = (seed * 1_000_003 + draw) * 2
    return torch.Generator().manual_seed(base), torch.Generator().manual_seed(base + 1)


def gradient_draws(method: Method, policy: TinyPolicy, draws: int, seed: int = 0) -> tuple[Tensor, list]:
    """``(grads [M, D], infos)``: M draws of the estimate of grad J (= -grad loss)."""
    table = policy.log_table().detach()
    grads, infos = [], []
    for m in range(draws):
        rollout_gen, correction_gen = draw_generators(seed, m)
        loss, info, _ = draw_loss(method, policy, table, rollout_gen, correction_gen)
        grads.append(-flat_grad(loss, policy) if loss.requires_grad else torch.zeros(policy.num_params, dtype=torch.float64))
        infos.append(info)
    return torch.stack(grads), infos


def _moments(weights: Tensor, grads: Tensor, sq: Tensor) -> tuple[Tensor, Tensor]:
    """Resampled means [R, D] and traces [R] from resampling counts ``weights`` [R, M]."""
    m = grads.shape[0]
    mean = weights @ grads / m
    trace = (weights @ sq / m - (mean * mean).sum(-1)) * m / (m - 1)
    return mean, trace


def _stats_from(mean: Tensor, trace: Tensor, m: int, true: Tensor, draw_cos: Tensor) -> dict[str, Tensor]:
    t2 = true @ true
    proj = mean @ true
    c = t2 / proj
    mean2 = (mean * mean).sum(-1)
    bias2 = ((c[:, None] * mean - true) ** 2).sum(-1) - c * c * trace / m
    rel_var = c * c * trace / t2
    return {
        "trace": trace,
        "mean_norm2": mean2 - trace / m,
        "snr": (mean2 - trace / m) / trace,
        "cos_mean": proj / (mean2.sqrt() * t2.sqrt()),
        "cos_draw": draw_cos,
        "rel_var": rel_var,
        "rel_bias2": bias2 / t2,
        "rel_mse": bias2 / t2 + rel_var,
    }


def bootstrap(grads: Tensor, true: Tensor, resamples: int = 1000, seed: int = 0) -> tuple[dict, dict]:
    """``(point, samples)``: the statistics of ``grads`` [M, D] and their ``resamples``
    bootstrap replicates (each a [R] tensor), resampling draws; ``seed`` fixes the indices, so
    two methods bootstrapped with one seed are resampled in pairs."""
    grads = grads.double()
    m = grads.shape[0]
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(m, (resamples, m), generator=g)
    weights = torch.zeros(resamples, m, dtype=torch.float64).scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))
    weights = torch.cat([torch.ones(1, m, dtype=torch.float64), weights])  # row 0: the sample itself
    sq = (grads * grads).sum(-1)
    cos = torch.nn.functional.cosine_similarity(grads, true[None], dim=1)
    cos = torch.nan_to_num(cos, nan=0.0)
    mean, trace = _moments(weights, grads, sq)
    stats = _stats_from(mean, trace, m, true, weights @ cos / m)
    point = {k: float(v[0]) for k, v in stats.items()}
    return point, {k: v[1:] for k, v in stats.items()}


def interval(samples: Tensor, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates (NaN ones dropped)."""
    s = samples[torch.isfinite(samples)]
    if s.numel() == 0:
        return math.nan, math.nan
    lo, hi = torch.quantile(s, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=s.dtype)).tolist()
    return lo, hi


def cosine(a: Tensor, b: Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


# ---------------------------------------------------------------------- learning curves
def learning_curve(method: Method, problem: Problem, seed: int, lr: float, steps: int, hidden: int = 64,
                   until: Optional[dict[str, int]] = None) -> dict:
    """Train a fresh policy (weights and rollouts from ``seed``: runs of one seed are paired)
    with Adam for ``steps`` steps of ``method`` (a marker corrector's policy has the marker
    column, ``policy.py``); ``until`` ({"sequences": n, "context_tokens": m}) stops it earlier,
    at the first point where every named total has reached its value.

    Returns ``curve``: the exact J before each step and after the last ([steps + 1]),
    ``sequences``: the sequences generated before each of those points ([steps + 1]),
    ``context_tokens`` likewise, and ``final_accuracy``: each prompt's accuracy after the last
    step ([P])."""
    policy = TinyPolicy(problem, hidden=hidden, seed=seed, marker=method.corrector.marker)
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    curve, sequences, tokens, total, total_tokens = [], [], [], 0, 0
    for step in range(steps + 1):
        table = policy.log_table().detach()
        objective, accuracy = exact_objective(problem, table)
        curve.append(float(objective))
        sequences.append(total)
        tokens.append(total_tokens)
        reached = until is not None and all({"sequences": total, "context_tokens": total_tokens}[k] >= v
                                            for k, v in until.items())
        if step == steps or reached:
            break
        rollout_gen, correction_gen = draw_generators(seed, step)
        loss, info, _ = draw_loss(method, policy, table, rollout_gen, correction_gen)
        total += info.sequences
        total_tokens += info.context_tokens
        optimizer.zero_grad(set_to_none=True)
        if loss.requires_grad:
            loss.backward()
            optimizer.step()
    return {"curve": curve, "sequences": sequences, "context_tokens": tokens,
            "final_accuracy": [round(float(a), 5) for a in accuracy]}


def first_reaching(curve: list[float], target: float) -> Optional[int]:
    """The first index whose value is >= target, None if none is."""
    return next((i for i, v in enumerate(curve) if v >= target), None)


def value_at_budget(curve: list[float], sequences: list[int], budget: float) -> float:
    """J after the last step whose cumulative sequences fit in ``budget``."""
    index = max(i for i, s in enumerate(sequences) if s <= budget)
    return curve[index]
