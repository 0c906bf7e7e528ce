"""The policy-gradient estimator's spread at fixed weights (``scripts/variance_at_fixed_policy.py``).

Each method draws M independent rollout batches (different seeds) for the same P prompts at the
same weights; a batch's gradient on a parameter subset is the sum of its prompts' parts,
``g_m = sum_p g_{m,p}`` (each part computed with the whole batch's loss denominators, so the
sum is the batch gradient exactly). From the [M, P, D] parts:

- ``trace_cov``: the trace of the gradient's covariance across batches (unbiased, over M), the
  estimator's total variance;
- ``cosine_to_mean``: each batch gradient's cosine to the mean of the OTHER batches (leave one
  out, so a batch is not compared with itself): a signal-to-noise measure that does not depend
  on the gradient's scale;
- ``bootstrap_trace``: a 95% percentile interval of the trace over seeds and prompts at once
  (``bootstrap_ratio``: of one method's trace over another's, prompts and batches drawn for both
  at once).
  The trace is ``sum_p v_p`` plus cross-prompt covariances, where ``v_p`` is prompt p's own
  trace across batches; the cross terms are 0 in expectation when each prompt's rollouts have
  their own seeds and their advantages are normalised within the prompt's group (the
  ``group`` scale), so the interval resamples batches and prompts and sums the drawn prompts'
  ``v_p``. (Summing drawn parts instead would count a prompt drawn twice with 4x its variance
  and double the trace on average.) ``bootstrap_cosine`` resamples batches only (the cosine is
  not a sum over prompts).

For i.i.d. rows the trace falls as 1/rows; ``per_row`` and ``per_flop`` scale it by the batch's
rows or FLOPs so that methods are compared at equal rows or equal compute (variance x cost:
lower is a better estimator for the cost).
"""
from __future__ import annotations

import math
import torch
from torch import Tensor


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


def prompt_grams(parts: Tensor) -> Tensor:
    """[P, M, M] each prompt's Gram matrix of its parts across batches, ``<g_{i,p}, g_{j,p}>``.
    Everything the trace and its bootstrap need, in P*M*M numbers instead of P*M*D: the results
    keep them, so two methods can be compared with intervals after the fact."""
    g = parts.double()
    return torch.einsum("ipd,jpd->pij", g, g)


def gram_trace(gram: Tensor) -> Tensor:
    """The unbiased trace of covariance of M vectors from their Gram matrix [..., M, M]:
    ``sum_i |g_i - mean|^2 / (M - 1) = (tr G - sum(G) / M) / (M - 1)``."""
    m = gram.shape[-1]
    return (gram.diagonal(dim1=-2, dim2=-1).sum(-1) - gram.sum(dim=(-2, -1)) / m) / (m - 1)


def prompt_traces(parts: Tensor) -> Tensor:
    """[P] each prompt's own trace of covariance across the M batches (unbiased)."""
    return gram_trace(prompt_grams(parts))


def _percentiles(values: list[float], confidence: float) -> tuple[float, float]:
    values = sorted(values)
    tail = (1 - confidence) / 2
    return values[int(math.floor(tail * (len(values) - 1)))], values[int(math.ceil((1 - tail) * (len(values) - 1)))]


def _resampled_rows(m: int, generator: torch.Generator) -> Tensor:
    while True:  # a resample of one distinct batch has no spread to measure
        rows = torch.randint(m, (m,), generator=generator)
        if len(set(rows.tolist())) > 1:
            return rows


def _resampled_trace(grams: Tensor, rows: Tensor, prompts: Tensor) -> float:
    """The trace of a resample: the drawn prompts' own traces over the drawn batches."""
    return float(gram_trace(grams[:, rows][:, :, rows])[prompts].sum())


def bootstrap_trace(parts: Tensor, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the trace, batches and prompts resampled (see the module docstring)."""
    return bootstrap_trace_from_grams(prompt_grams(parts), n_resamples, seed, confidence)


def bootstrap_trace_from_grams(grams: Tensor, n_resamples: int = 1000, seed: int = 0,
                               confidence: float = 0.95) -> tuple[float, float]:
    p, m = grams.shape[:2]
    generator = torch.Generator().manual_seed(seed)
    values = []
    for _ in range(n_resamples):
        rows = _resampled_rows(m, generator)
        prompts = torch.randint(p, (p,), generator=generator)
        values.append(_resampled_trace(grams, rows, prompts))
    return _percentiles(values, confidence)


def bootstrap_ratio(grams_a: Tensor, grams_b: Tensor, n_resamples: int = 1000, seed: int = 0,
                    confidence: float = 0.95, paired_batches: bool = True) -> tuple[float, float]:
    """Percentile interval of ``trace_a / trace_b`` for two methods measured on the same prompts.
    The prompts are drawn once per resample for both (how hard a prompt is, the largest source
    of spread, cancels in the ratio). With ``paired_batches`` the batches are drawn once for both
    as well: batch m of every method samples with the same rollout seeds (``training.seeding``
    makes them a function of seed, step and row), so methods at the same G share their rollouts
    and the batch-to-batch luck (which groups came out mixed) cancels too. Drawing batch m for
    both at once is valid whether or not the two are dependent, because the pairs
    (batch m of a, batch m of b) are i.i.d. over m; ``paired_batches=False`` draws each method's
    batches on its own (for batches that are not matched by index)."""
    if grams_a.shape[0] != grams_b.shape[0]:
        raise ValueError(f"the methods were measured on {grams_a.shape[0]} and {grams_b.shape[0]} prompts")
    if paired_batches and grams_a.shape[1] != grams_b.shape[1]:
        raise ValueError(f"paired batches need as many batches in each method, got {grams_a.shape[1]} "
                         f"and {grams_b.shape[1]}")
    p = grams_a.shape[0]
    generator = torch.Generator().manual_seed(seed)
    values = []
    for _ in range(n_resamples):
        rows_a = _resampled_rows(grams_a.shape[1], generator)
        rows_b = rows_a if paired_batches else _resampled_rows(grams_b.shape[1], generator)
        prompts = torch.randint(p, (p,), generator=generator)
        denominator = _resampled_trace(grams_b, rows_b, prompts)
        if denominator > 0:  # a resample whose baseline drew only zero-gradient prompts has no ratio
            values.append(_resampled_trace(grams_a, rows_a, prompts) / denominator)
    if not values:
        raise ValueError("the baseline's gradient is zero on every resample")
    return _percentiles(values, confidence)


def bootstrap_cosine(parts: Tensor, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean leave-one-out cosine, batches resampled. A drawn batch is
    compared with the drawn batches that are not copies of itself (a copy in "the others" would
    make it look like the mean)."""
    m = parts.shape[0]
    grads = batch_gradients(parts).double()
    generator = torch.Generator().manual_seed(seed)
    values = []
    for _ in range(n_resamples):
        rows = _resampled_rows(m, generator)
        same = rows[:, None] == rows[None, :]  # [M, M] copies of one batch
        others = ((~same).double() @ grads[rows]) / (~same).sum(dim=1, keepdim=True).double()
        values.append(float(torch.nn.functional.cosine_similarity(grads[rows], others, dim=1).mean()))
    return _percentiles(values, confidence)


def summarize(parts: Tensor, rows_per_batch: float, flops_per_batch: float, n_resamples: int = 1000,
              seed: int = 0) -> dict:
    """The method's numbers: trace, cosine, and the trace at equal rows and equal compute, with CIs."""
    grads = batch_gradients(parts)
    trace = trace_cov(grads)
    cos = cosine_to_mean(grads)
    grams = prompt_grams(parts)
    trace_ci = bootstrap_trace_from_grams(grams, n_resamples, seed)
    cos_ci = bootstrap_cosine(parts, n_resamples, seed)
    return {
        "batches": int(parts.shape[0]),
        "prompts": int(parts.shape[1]),
        "dims": int(parts.shape[2]),
        "rows_per_batch": rows_per_batch,
        "flops_per_batch": flops_per_batch,
        "trace_cov": trace,
        "trace_cov_ci": list(trace_ci),
        "cosine_to_mean": float(cos.mean()),
        "cosine_to_mean_ci": list(cos_ci),
        "mean_grad_sq_norm": float((grads.double().mean(dim=0) ** 2).sum()),
        # Variance x cost: what the same variance costs (lower: more signal per row / per FLOP).
        "trace_cov_x_rows": trace * rows_per_batch,
        "trace_cov_x_rows_ci": [v * rows_per_batch for v in trace_ci],
        "trace_cov_x_flops": trace * flops_per_batch,
        "trace_cov_x_flops_ci": [v * flops_per_batch for v in trace_ci],
        "prompt_grams": grams.tolist(),  # for paired intervals between methods (bootstrap_ratio)
    }
