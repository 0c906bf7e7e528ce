"""GRPO / DAPO token-level clipped loss (METHOD section 4).

Per token: ``rho_t = exp(logp_t - old_logp_t)``,
``loss_t = -w_t * min(rho_t*A, clip(rho_t, 1-eps_low, 1+eps_high)*A)``,
then ``aggregate(loss, mask, agg_mode, num_seqs, num_tokens)``:
"seq-mean-token-mean" is GRPO, "token-mean" is DAPO's token-level loss.

The KL penalty to a reference is not part of this loss: it is added to any loss, with a choice
of estimator (``regularizers.py``), aggregated like the loss (the sum of the two aggregates is
the aggregate of ``loss_t + beta * kl_t``: every aggregation is linear). It is not multiplied
by ``w_t``: token weights re-weight credit, not the trust region to the reference.

Choices: eps_low = eps_high = 0.2 by default (PPO/GRPO; DAPO's clip-higher is eps_high=0.28);
no dual-clip and no log-ratio clamp; computed in float32.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ibpo_lit.algorithms.aggregation import aggregate, per_token
from ibpo_lit.algorithms.registry import POLICY_LOSSES, LossInputs, LossSettings


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg_mode: str = "seq-mean-token-mean",
    token_weights: Tensor | None = None,
    num_seqs: float | None = None,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level clipped surrogate, aggregated.

    Args:
        logp: [B, T] log pi_theta of the sampled tokens (requires grad).
        old_logp: [B, T] log pi_old (constant).
        advantages: [B] one advantage per sequence, broadcast over its tokens, or [B, T] one
            per token (REINFORCE++).
        mask: [B, T] bool or float, passed to ``aggregate``.
        eps_low, eps_high: clip range ``[1 - eps_low, 1 + eps_high]`` of ``rho_t``.
        agg_mode: a name in ``AGGREGATIONS``.
        token_weights: [B, T] float ``w_t`` or None (all 1).
        num_seqs, num_tokens: global counts for micro-batching (see ``aggregation.py``).

    Returns:
        loss: [] float32 scalar to minimise.
        metrics: detached [] tensors "clip_frac" (share of valid tokens whose clipped branch
            is active) and "ratio_mean" (mean ``rho_t`` over valid tokens); clip_frac 0 and
            ratio_mean 1 when no token is valid.
    """
    valid = mask != 0
    # where(), not * mask: padding may hold -inf log-probs.
    logp = torch.where(valid, logp.float(), 0.0)
    old_logp = torch.where(valid, old_logp.float(), 0.0)
    adv = per_token(advantages.float(), valid)  # [B, 1] or [B, T]

    ratio = torch.exp(logp - old_logp)  # [B, T]
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
    if token_weights is not None:
        surrogate = surrogate * torch.where(valid, token_weights.float(), 0.0)
    loss = aggregate(-surrogate, mask, agg_mode, num_seqs=num_seqs, num_tokens=num_tokens)

    with torch.no_grad():
        n_valid = valid.sum().clamp_min(1).float()
        is_clipped = ((adv > 0) & (ratio > 1.0 + eps_high)) | ((adv < 0) & (ratio < 1.0 - eps_low))
        metrics = {
            "clip_frac": (is_clipped & valid).sum() / n_valid,
            # 1 (not 0) when there is no valid token, as in gspo_loss.
            "ratio_mean": torch.where(valid, ratio, 0.0).sum() / n_valid
            if valid.any()
            else torch.ones((), device=ratio.device),
        }
    return loss, metrics


@POLICY_LOSSES.register("grpo")
def grpo_policy_loss(inputs: LossInputs, settings: LossSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """``grpo_loss`` under the registry's contract."""
    optional = {"agg_mode": settings.agg_mode} if settings.agg_mode is not None else {}
    return grpo_loss(inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask, settings.eps_low,
                     settings.eps_high, token_weights=inputs.token_weights, num_seqs=inputs.num_seqs,
                     num_tokens=inputs.num_tokens, **optional)
