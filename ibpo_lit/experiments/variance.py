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
- ``resampled_snr``: ``|E g|^2 / tr Cov``, scale-free like the cosine, and with intervals over
  prompts as well (it is built from sums over prompts, the cosine is not);
- ``bootstrap_trace``: a 95% percentile interval of the trace over seeds and prompts at once
  (``bootstrap_ratio``: of one method's trace over another's, prompts and batches drawn for both
  at once; ``bootstrap_snr`` and ``bootstrap_snr_difference`` likewise for the signal-to-noise).
  The trace is ``sum_p v_p`` plus cross-prompt covariances, where ``v_p`` is prompt p's own
  trace across batches; the cross terms are 0 in expectation when each prompt's rollouts have
  their own seeds and their advantages are normalised within the prompt's group (the
  ``group`` scale), so the interval resamples batches and prompts and sums the drawn prompts'
  ``v_p``. (Summing drawn parts instead would count a prompt drawn twice with 4x its variance
  and double the trace on average.) The signal-to-noise needs the cross-prompt inner products
  too (the mean gradient is a sum over prompts): ``cross_grams`` keeps them, [P, P, M, M].
  ``bootstrap_cosine`` resamples batches only (the cosine is not a sum over prompts).

For i.i.d. rows the trace falls as 1/rows; ``per_row`` and ``per_flop`` scale it by the batch's
rows or FLOPs so that methods are compared at equal rows or equal compute (variance x cost:
lower is a better estimator for the cost).
"""
from __future__ import annotations

import math
from typing import Optional

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


def cross_grams(parts: Tensor) -> Tensor:
    """[P, P, M, M] the inner products of every prompt's part in every batch with every other's,
    ``<g_{i,p}, g_{j,q}>``: what the signal-to-noise and its intervals need (the mean gradient is
    a sum over prompts), in P*P*M*M numbers instead of P*M*D. ``own_grams`` is its diagonal."""
    g = parts.double()
    return torch.einsum("ipd,jqd->pqij", g, g)


def own_grams(cross: Tensor) -> Tensor:
    """[P, M, M] each prompt's own Gram matrix (``prompt_grams``) from the cross Gram [P, P, M, M]."""
    return cross.diagonal(dim1=0, dim2=1).permute(2, 0, 1)


def gram_trace(gram: Tensor, counts: Optional[Tensor] = None) -> Tensor:
    """The unbiased trace of covariance of M vectors from their Gram matrix [..., M, M]:
    ``sum_i |g_i - mean|^2 / (M - 1) = (tr G - sum(G) / M) / (M - 1)``; with ``counts`` [M], of
    the M vectors drawn ``counts[i]`` times each (a bootstrap resample's batches)."""
    m = gram.shape[-1]
    if counts is None:
        counts = torch.ones(m, dtype=gram.dtype, device=gram.device)
    diag, total = _row_sums(gram, counts)
    return (diag - total / m) / (m - 1)


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


def _bootstrap(statistic, p: int, m: int, n_resamples: int, seed: int, confidence: float) -> tuple[float, float]:
    """Percentile interval of ``statistic(rows, prompts)`` over resamples that draw M batches and P
    prompts with replacement. A statistic that returns None has no value on that resample (a
    ratio whose baseline drew only zero-gradient prompts) and is left out."""
    generator = torch.Generator().manual_seed(seed)
    values = []
    for _ in range(n_resamples):
        rows = _resampled_rows(m, generator)
        prompts = torch.randint(p, (p,), generator=generator)
        value = statistic(rows, prompts)
        if value is not None:
            values.append(value)
    if not values:
        raise ValueError("the statistic has no value on any resample (the baseline's gradient is zero on every one)")
    return _percentiles(values, confidence)


def _row_sums(gram: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """``sum_i c_i G_ii`` and ``sum_ij c_i c_j G_ij`` of Gram matrices [..., M, M] over batches drawn
    ``counts`` [M] times each: the drawn batches' Gram sums without copying it per resample."""
    diag = gram.diagonal(dim1=-2, dim2=-1) @ counts
    return diag, (gram @ counts) @ counts


def _resampled_trace(grams: Tensor, rows: Tensor, prompts: Tensor) -> float:
    """The trace of a resample: the drawn prompts' own traces over the drawn batches (``gram_trace``
    of the drawn rows, from counts)."""
    counts = torch.bincount(rows, minlength=grams.shape[-1]).to(grams.dtype)
    return float(gram_trace(grams, counts)[prompts].sum())


def resampled_snr(cross: Tensor, rows: Optional[Tensor] = None, prompts: Optional[Tensor] = None) -> float:
    """``signal_to_noise`` of the batches ``rows`` of the prompts ``prompts`` (all of them by
    default: the point estimate) from the cross Gram [P, P, M, M]. Each drawn prompt counts as an
    instance of its own: the noise is the drawn prompts' own traces summed (as in the trace's
    interval), the signal ``|sum of the drawn prompts' mean parts|^2``. Two copies of one prompt
    share its noise, so each pair of copies carries ``v_p / M`` more of ``|mean|^2``'s bias, taken
    off with the rest. With every prompt once this is ``signal_to_noise(|mean|^2, sum_p v_p, M)``."""
    p, m = cross.shape[0], cross.shape[2]
    # Draws as counts: what a resample sums over its drawn batches and prompts, without copying
    # the [P, P, M, M] Gram for every resample.
    c = torch.ones(m, dtype=cross.dtype) if rows is None else torch.bincount(rows, minlength=m).to(cross.dtype)
    n = torch.ones(p, dtype=cross.dtype) if prompts is None else torch.bincount(prompts, minlength=p).to(cross.dtype)
    mean_dot = _row_sums(cross, c)[1] / m ** 2  # [P, P] <mean part p, mean part q> over the drawn batches
    own = gram_trace(own_grams(cross), c)  # [P] each prompt's own trace over the drawn batches
    copies_bias = float((n * (n - 1)) @ own) / m  # n draws of a prompt: n (n - 1) pairs of copies
    return signal_to_noise(float(n @ mean_dot @ n) - copies_bias, float(n @ own), m)


def bootstrap_trace(parts: Tensor, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the trace, batches and prompts resampled (see the module docstring)."""
    return bootstrap_trace_from_grams(prompt_grams(parts), n_resamples, seed, confidence)


def bootstrap_trace_from_grams(grams: Tensor, n_resamples: int = 1000, seed: int = 0,
                               confidence: float = 0.95) -> tuple[float, float]:
    return _bootstrap(lambda rows, prompts: _resampled_trace(grams, rows, prompts),
                      grams.shape[0], grams.shape[1], n_resamples, seed, confidence)


def _check_paired(a: Tensor, b: Tensor, paired_batches: bool = True) -> None:
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"the methods were measured on {a.shape[0]} and {b.shape[0]} prompts")
    if paired_batches and a.shape[-1] != b.shape[-1]:
        raise ValueError(f"paired batches need as many batches in each method, got {a.shape[-1]} and {b.shape[-1]}")


def bootstrap_ratio(grams_a: Tensor, grams_b: Tensor, n_resamples: int = 1000, seed: int = 0,
                    confidence: float = 0.95, paired_batches: bool = True) -> tuple[float, float]:
    """Percentile interval of ``trace_a / trace_b`` for two methods measured on the same prompts.
    The prompts are drawn once per resample for both (how hard a prompt is, the largest source
    of spread, cancels in the ratio). With ``paired_batches`` the batches are drawn once for both
    as well: batch m of every method samples with the same rollout seeds (``training.seeding``
    makes them a function of seed, step and row), so methods at the same G share their rollouts
    and the batch-to-batch luck (which groups came out mixed) cancels too. Drawing batch m for
    both at once is valid whether or not the two are dependent, because the pairs
    (batch m of a, batch m of b) are i.i.d. over m; ``paired_batches=False`` draws b's batches
    on their own (for batches that are not matched by index)."""
    _check_paired(grams_a, grams_b, paired_batches)
    own_rows = torch.Generator().manual_seed(seed + 1)  # b's batches when they are not paired

    def ratio(rows, prompts):
        rows_b = rows if paired_batches else _resampled_rows(grams_b.shape[1], own_rows)
        denominator = _resampled_trace(grams_b, rows_b, prompts)
        return _resampled_trace(grams_a, rows, prompts) / denominator if denominator > 0 else None

    return _bootstrap(ratio, grams_a.shape[0], grams_a.shape[1], n_resamples, seed, confidence)


def bootstrap_snr(cross: Tensor, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the signal-to-noise, batches and prompts resampled."""
    return _bootstrap(lambda rows, prompts: resampled_snr(cross, rows, prompts),
                      cross.shape[0], cross.shape[2], n_resamples, seed, confidence)


def bootstrap_snr_difference(cross_a: Tensor, cross_b: Tensor, n_resamples: int = 1000, seed: int = 0,
                             confidence: float = 0.95) -> tuple[float, float]:
    """Percentile interval of ``snr_a - snr_b``, paired by prompt and by batch as in
    ``bootstrap_ratio``. A difference, not a ratio: a resample's signal can be estimated below 0."""
    _check_paired(cross_a, cross_b)
    return _bootstrap(lambda rows, prompts: resampled_snr(cross_a, rows, prompts) - resampled_snr(cross_b, rows, prompts),
                      cross_a.shape[0], cross_a.shape[2], n_resamples, seed, confidence)


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
    """The method's numbers: trace, cosine, signal-to-noise, and the trace at equal rows and equal
    compute, with CIs."""
    grads = batch_gradients(parts)
    trace = trace_cov(grads)
    cos = cosine_to_mean(grads)
    cross = cross_grams(parts)
    trace_ci = bootstrap_trace_from_grams(own_grams(cross), n_resamples, seed)
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
        "signal_to_noise": resampled_snr(cross),
        "signal_to_noise_ci": list(bootstrap_snr(cross, n_resamples, seed)),
        # Variance x cost: what the same variance costs (lower: more signal per row / per FLOP).
        "trace_cov_x_rows": trace * rows_per_batch,
        "trace_cov_x_rows_ci": [v * rows_per_batch for v in trace_ci],
        "trace_cov_x_flops": trace * flops_per_batch,
        "trace_cov_x_flops_ci": [v * flops_per_batch for v in trace_ci],
        # For intervals between methods after the fact (bootstrap_ratio, bootstrap_snr_difference).
        "prompt_cross_grams": cross.tolist(),
    }
