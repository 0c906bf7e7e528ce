"""Diagnostics of METHOD section 6 as pure functions: what the paper measured.

- ``reward_shaping_covariance``: ``Cov(Y, phi)`` with ``Y = 2r - 1`` and ``phi = Delta``
  (Assumption A.1 expects it below 0 at every step).
- ``gradient_variance``: the spread of K policy gradients computed on K disjoint splits of
  one update batch (paper: about 30% lower with IBPO than plain GSPO).
- ``estimate_flops``: the compute of one step, so that reward can be plotted against compute.

Covered: the formulas. The callbacks that feed them live in ``callbacks/``
(``CorrectionMetrics``, ``GradientVarianceLogger``, ``ComputeBudgetStopper``).

Not covered, by choice:
- ``gradient_variance`` measures the variance of a *split* gradient, i.e. of a gradient
  estimate from ``N / K`` rows; the variance of the full-batch estimate is about ``trace / K``.
  Compare runs at equal ``K`` and equal batch size.
- ``estimate_flops`` counts parameter FLOPs only (the ``2N`` / ``6N`` rules of Kaplan et al.
  2020 and Chinchilla): it ignores attention's quadratic term (``~ 2 * n_layers * ctx * d``
  per token), which matters for long contexts, and it does not know about KV-cache reuse,
  padding, or recomputation under activation checkpointing. It is a compute *estimate* for
  comparing runs of one model, not a hardware measurement.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def reward_shaping_covariance(rewards: Tensor, delta: Tensor) -> float:
    """Population covariance ``Cov(Y, phi)`` over the rows with a finite reward.

    Args:
        rewards: [B] float verifier rewards ``r`` in {0, 1}; NaN = unscorable (row dropped).
        delta: [B] float IBPO shaping term ``phi_i = Delta_i`` (0 where not shaped).

    Returns:
        ``mean((Y - mean Y) * (phi - mean phi))`` with ``Y = 2r - 1`` in {-1, 1}, over rows
        whose reward and delta are finite; NaN when there is no such row.
    """
    if rewards.shape != delta.shape or rewards.dim() != 1:
        raise ValueError(f"rewards and delta must both be [B], got {tuple(rewards.shape)} and {tuple(delta.shape)}")
    r = rewards.detach().double().cpu()
    phi = delta.detach().double().cpu()
    keep = torch.isfinite(r) & torch.isfinite(phi)
    if not keep.any():
        return math.nan
    y = 2.0 * r[keep] - 1.0
    phi = phi[keep]
    return float(((y - y.mean()) * (phi - phi.mean())).mean())


def gradient_variance(split_grads: Tensor) -> dict[str, float]:
    """Spread of K gradient estimates of one batch.

    Args:
        split_grads: [K, D] float, row k the flattened policy gradient of split k (K >= 2).

    Returns:
        ``trace``: ``sum_d Var_k(g_kd)`` with the unbiased (K - 1) variance, the trace of the
        covariance of a split gradient; ``mean_sq_norm``: ``||mean_k g_k||^2``; ``relative``:
        ``trace / mean_sq_norm`` (NaN when the mean gradient is 0 or either is not finite).
    """
    if split_grads.dim() != 2 or split_grads.shape[0] < 2:
        raise ValueError(f"split_grads must be [K, D] with K >= 2, got {tuple(split_grads.shape)}")
    g = split_grads.detach().double()
    trace = float(g.var(dim=0, unbiased=True).sum())
    mean_sq_norm = float(g.mean(dim=0).pow(2).sum())
    if mean_sq_norm > 0 and math.isfinite(mean_sq_norm) and math.isfinite(trace):
        relative = trace / mean_sq_norm
    else:
        relative = math.nan
    return {"trace": trace, "mean_sq_norm": mean_sq_norm, "relative": relative}


def estimate_flops(
    n_params: int,
    prompt_tokens: int,
    generated_tokens: int,
    trained_tokens: int,
    no_grad_tokens: int = 0,
) -> dict[str, float]:
    """Parameter-FLOPs estimate of one step (attention's quadratic term ignored).

    Args:
        n_params: N, parameters of the model (embeddings included).
        prompt_tokens: tokens prefilled by generation (rollout and correction prompts, counted
            once per sample).
        generated_tokens: tokens decoded (rollouts and corrections).
        trained_tokens: prompt + response tokens forwarded with grad (forward and backward).
        no_grad_tokens: tokens of extra no-grad forwards (pi_old, reference policy).

    Returns:
        ``generation = 2N * (prompt_tokens + generated_tokens)`` (forward only),
        ``training = 6N * trained_tokens`` (forward 2N + backward 4N),
        ``no_grad = 2N * no_grad_tokens``, and their sum ``total``.
    """
    counts = {
        "n_params": n_params,
        "prompt_tokens": prompt_tokens,
        "generated_tokens": generated_tokens,
        "trained_tokens": trained_tokens,
        "no_grad_tokens": no_grad_tokens,
    }
    for name, value in counts.items():
        if value < 0:
            raise ValueError(f"estimate_flops: {name} must be >= 0, got {value}")
    n = float(n_params)
    out = {
        "generation": 2.0 * n * (prompt_tokens + generated_tokens),
        "training": 6.0 * n * trained_tokens,
        "no_grad": 2.0 * n * no_grad_tokens,
    }
    out["total"] = out["generation"] + out["training"] + out["no_grad"]
    return out
