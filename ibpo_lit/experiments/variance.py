"""The policy-gradient estimator's spread at fixed weights (``scripts/variance_at_fixed_policy.py``).

Each method draws M independent rollout batches (different seeds) for the same P prompts at the
same weights; a batch's gradient on a parameter subset is the sum of its prompts' parts,
``g_m = sum_p g_{m,p}`` (each part computed with the whole batch's loss denominators, so the
sum is the batch gradient exactly). Everything below is computed from the inner products of the
parts, ``cross_grams`` [P, P, M, M] (``<g_{i,p}, g_{j,q}>``), which the results keep, so the
statistics and their intervals can be recomputed after the fact without the [M, P, D] parts:

- ``batch_gram``: the [M, M] Gram matrix of the batch gradients (the sum of every prompt pair's
  block); of a subset of the prompts, rescaled to P prompts (below).
- ``gram_trace``: the trace of the batch gradient's covariance across batches (unbiased, over
  M), the estimator's total variance. It includes the cross-prompt covariances: prompts share
  the batch's loss denominators, and on the stored runs the cross terms are -9% to +18% of the
  trace, so leaving them out would measure another quantity than the batch gradient's variance.
- ``gram_cosine``: each batch gradient's cosine to the mean of the OTHER batches (leave one out,
  so a batch is not compared with itself), averaged: a signal-to-noise measure that does not
  depend on the gradient's scale.
- ``gram_snr``: ``|E g|^2 / tr Cov`` (``signal_to_noise``, the ``tr / M`` bias of ``|mean|^2``
  taken off), scale-free like the cosine; same trace as ``gram_trace``.
- ``jackknife_interval``: a 95% interval for any of these, or for a ratio or difference of two
  methods measured on the same prompts (the same batch and prompt left out of both: paired),
  from delete-one jackknives over batches and over prompts. Why not the bootstrap used before:
  a resample that draws a batch twice has two identical gradients, which lowers its trace and
  raises its signal-to-noise, so the percentile intervals leaned (the trace's toward 0, the
  signal-to-noise's upward, with long right tails). A jackknife never duplicates a batch.

How the jackknife is built. Leaving batch m out gives the statistic of M - 1 batches; leaving
prompt p out gives it for the other P - 1 prompts, rescaled to P prompts as a U-statistic (the
prompts' own blocks x P / (P - 1), the cross-prompt blocks x P (P - 1) / ((P - 1)(P - 2)) =
P / (P - 2)), so that "a batch of P prompts" is the quantity throughout. Each source gives a
jackknife variance ``(n - 1) / n * sum (theta_i - mean)^2``; they are added (which counts the
batch x prompt interaction twice: slightly conservative, as Owen's pigeonhole bootstrap), and the
interval is ``point -+ t_df * sqrt(V)`` with the Welch-Satterthwaite degrees of freedom of that
sum, each jackknife variance counted with its own n - 1: ``df = (V_b + V_p)^2 / (V_b^2 / (M - 1)
+ V_p^2 / (P - 1))``. That df lies between min(M - 1, P - 1) (one source dominates) and
(M - 1) + (P - 1) (reached when V_b / V_p = (M - 1) / (P - 1)), not between M - 1 and P - 1;
with batches only it is M - 1. Traces and ratios of traces are positive and skewed: their
intervals are built on the log scale. The cosine is not a sum over prompts (its rescaled Gram need not be positive
definite), so its interval leaves out batches only: it is conditional on the P prompts.

For i.i.d. rows the trace falls as 1/rows; ``per_row`` and ``per_flop`` scale it by the batch's
rows or FLOPs so that methods are compared at equal rows or equal compute (variance x cost:
lower is a better estimator for the cost).

What is not covered: intervals for fewer than 2 batches or 2 prompts (the jackknife needs
both; with 1 prompt only batches are left out); simultaneous intervals over methods.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ibpo_lit.evaluation.bootstrap import t_quantile


def trace_cov(grads: Tensor) -> float:
    """Trace of the covariance of ``grads`` [M, D] across its M rows (unbiased; M >= 2)."""
    if grads.shape[0] < 2:
        raise ValueError(f"need at least 2 batches, got {grads.shape[0]}")
    g = grads.double()
    return float(((g - g.mean(dim=0)) ** 2).sum() / (g.shape[0] - 1))


def cosine_to_mean(grads: Tensor) -> Tensor:
    """[M] cosine of each batch gradient to the mean of the other batches (leave one out)."""
    g = grads.double()
    m = g.shape[0]
    others = (g.sum(dim=0, keepdim=True) - g) / (m - 1)
    return torch.nn.functional.cosine_similarity(g, others, dim=1)


def signal_to_noise(mean_grad_sq_norm: float, trace: float, batches: int) -> float:
    """``|E g|^2 / tr Cov(g)`` from a method's numbers, scale-free: a method whose loss divides by
    more rows (IBPO's batch holds its corrections too) shrinks its gradient's mean and its
    covariance alike, and only this ratio (like the cosine) tells more signal from a smaller
    gradient. ``|mean|^2`` of M batches overestimates ``|E g|^2`` by ``tr Cov / M``; that is
    taken off."""
    return (mean_grad_sq_norm - trace / batches) / trace if trace > 0 else float("nan")


def batch_gradients(parts: Tensor) -> Tensor:
    """[M, D] batch gradients from per-prompt parts [M, P, D]."""
    return parts.sum(dim=1)


def cross_grams(parts: Tensor) -> Tensor:
    """[P, P, M, M] the inner products of every prompt's part in every batch with every other's,
    ``<g_{i,p}, g_{j,q}>``: everything the statistics and their intervals need, in P*P*M*M
    numbers instead of P*M*D."""
    g = parts.double()
    return torch.einsum("ipd,jqd->pqij", g, g)


def batch_gram(cross: Tensor, prompts: Optional[Sequence[int]] = None) -> Tensor:
    """[M, M] Gram matrix of the batch gradients from the cross Gram [P, P, M, M]. With
    ``prompts`` (a subset of s of the P), the Gram a batch of P prompts would have if the others
    were like these: own blocks x P / s, cross-prompt blocks x P (P - 1) / (s (s - 1)); all
    prompts give the batch gradients' Gram exactly."""
    p = cross.shape[0]
    if prompts is not None:
        keep = torch.as_tensor(list(prompts), dtype=torch.long)
        cross = cross[keep][:, keep]
    s = cross.shape[0]
    own = cross.diagonal(dim1=0, dim2=1).sum(dim=-1)
    others = cross.sum(dim=(0, 1)) - own
    if s == p:
        return own + others
    return own * (p / s) + (others * (p * (p - 1) / (s * (s - 1))) if s > 1 else 0.0)


def gram_trace(gram: Tensor) -> float:
    """The unbiased trace of covariance of M vectors from their Gram matrix [M, M]:
    ``sum_i |g_i - mean|^2 / (M - 1) = (tr G - sum(G) / M) / (M - 1)``."""
    m = gram.shape[-1]
    if m < 2:
        raise ValueError(f"need at least 2 batches, got {m}")
    return float((torch.trace(gram) - gram.sum() / m) / (m - 1))


def gram_mean_sq(gram: Tensor) -> float:
    """``|mean of the M vectors|^2`` from their Gram matrix."""
    return float(gram.sum() / gram.shape[-1] ** 2)


def gram_snr(gram: Tensor) -> float:
    """``signal_to_noise`` of M batch gradients from their Gram matrix."""
    return signal_to_noise(gram_mean_sq(gram), gram_trace(gram), gram.shape[-1])


def gram_cosine(gram: Tensor) -> float:
    """The mean over batches of each batch gradient's cosine to the mean of the others
    (``cosine_to_mean``), from their Gram matrix."""
    m = gram.shape[-1]
    row, diag, total = gram.sum(dim=1), gram.diagonal(), gram.sum()
    dot = (row - diag) / (m - 1)  # <g_i, mean of the others>
    others_sq = (total - 2 * row + diag) / (m - 1) ** 2  # |mean of the others|^2
    norms = torch.sqrt(diag.clamp_min(1e-16) * others_sq.clamp_min(1e-16))  # a zero gradient: cosine 0
    return float((dot / norms).mean())


def _drop(gram: Tensor, m: int) -> Tensor:
    keep = [i for i in range(gram.shape[-1]) if i != m]
    return gram[keep][:, keep]


def _jackknife_variance(values: Sequence[float]) -> float:
    n = len(values)
    mean = sum(values) / n
    return (n - 1) / n * sum((v - mean) ** 2 for v in values)


def jackknife_interval(statistic: Callable[..., float], crosses: Sequence[Tensor], prompts: bool = True,
                       log: bool = False, confidence: float = 0.95) -> tuple[float, float, float]:
    """``(point, low, high)`` of ``statistic(*grams)``, one [M, M] batch Gram per method in
    ``crosses`` (their cross Grams [P, P, M, M], measured on the same prompts with as many
    batches), from delete-one jackknives over batches and, with ``prompts``, over prompts
    (see the module docstring). ``log``: the interval is built on ``log(statistic)`` (for a
    positive statistic; the linear scale is used when some leave-one-out value is not positive).
    NaN bounds when the statistic has no value on some leave-one-out (a zero trace below a ratio)."""
    first = crosses[0]
    for other in crosses[1:]:
        if other.shape[0] != first.shape[0]:
            raise ValueError(f"the methods were measured on {first.shape[0]} and {other.shape[0]} prompts")
        if other.shape[-1] != first.shape[-1]:
            raise ValueError(f"paired batches need as many batches in each method, got {first.shape[-1]} "
                             f"and {other.shape[-1]}")
    p, m = first.shape[0], first.shape[-1]
    grams = [batch_gram(c) for c in crosses]
    point = statistic(*grams)
    by_batch = [statistic(*(_drop(g, i) for g in grams)) for i in range(m)]
    by_prompt = [statistic(*(batch_gram(c, [q for q in range(p) if q != i]) for c in crosses))
                 for i in range(p)] if prompts and p > 1 else []
    values = [point, *by_batch, *by_prompt]
    if not all(math.isfinite(v) for v in values):
        return point, math.nan, math.nan
    use_log = log and all(v > 0 for v in values)
    f = math.log if use_log else (lambda v: v)
    var_b = _jackknife_variance([f(v) for v in by_batch])
    var_p = _jackknife_variance([f(v) for v in by_prompt]) if by_prompt else 0.0
    total = var_b + var_p
    if total == 0:
        return point, point, point
    df = total ** 2 / (var_b ** 2 / (m - 1) + (var_p ** 2 / (p - 1) if by_prompt else 0.0))
    half = t_quantile(confidence, df) * math.sqrt(total)
    if use_log:
        return point, math.exp(math.log(point) - half), math.exp(math.log(point) + half)
    return point, point - half, point + half


def trace_ratio(a: Tensor, b: Tensor) -> float:
    """``gram_trace(a) / gram_trace(b)`` (NaN when b's is 0)."""
    den = gram_trace(b)
    return gram_trace(a) / den if den > 0 else math.nan


def snr_difference(a: Tensor, b: Tensor) -> float:
    """``gram_snr(a) - gram_snr(b)``: a difference, not a ratio (a signal estimate can be below 0)."""
    return gram_snr(a) - gram_snr(b)


def summarize_grams(cross: Tensor, rows_per_batch: float, flops_per_batch: float) -> dict:
    """The method's numbers from its cross Gram [P, P, M, M]: trace, cosine, signal-to-noise, and
    the trace at equal rows and equal compute, with 95% jackknife intervals."""
    gram = batch_gram(cross)
    trace, lo, hi = jackknife_interval(gram_trace, [cross], log=True)
    own = sum(gram_trace(cross[p, p]) for p in range(cross.shape[0]))
    return {
        "batches": int(cross.shape[-1]),
        "prompts": int(cross.shape[0]),
        "rows_per_batch": rows_per_batch,
        "flops_per_batch": flops_per_batch,
        "intervals": "95% delete-one jackknife over batches and prompts (cosine: batches), t with "
                     "Satterthwaite's df; traces on the log scale",
        "trace_cov": trace,
        "trace_cov_ci": [lo, hi],
        # the cross-prompt covariances' part of the trace (in it, and in its interval)
        "cross_prompt_share": (trace - own) / trace if trace > 0 else math.nan,
        "cosine_to_mean": gram_cosine(gram),
        "cosine_to_mean_ci": list(jackknife_interval(gram_cosine, [cross], prompts=False)[1:]),
        "mean_grad_sq_norm": gram_mean_sq(gram),
        "signal_to_noise": gram_snr(gram),
        "signal_to_noise_ci": list(jackknife_interval(gram_snr, [cross])[1:]),
        # Variance x cost: what the same variance costs (lower: more signal per row / per FLOP).
        "trace_cov_x_rows": trace * rows_per_batch,
        "trace_cov_x_rows_ci": [lo * rows_per_batch, hi * rows_per_batch],
        "trace_cov_x_flops": trace * flops_per_batch,
        "trace_cov_x_flops_ci": [lo * flops_per_batch, hi * flops_per_batch],
    }


def summarize(parts: Tensor, rows_per_batch: float, flops_per_batch: float) -> dict:
    """``summarize_grams`` of the parts [M, P, D], with the cross Gram kept (for intervals
    between methods after the fact, and for recomputing these)."""
    cross = cross_grams(parts)
    return {**summarize_grams(cross, rows_per_batch, flops_per_batch), "dims": int(parts.shape[2]),
            "prompt_cross_grams": cross.tolist()}
