"""GSPO loss (METHOD section 3), implemented as GSPO-token.

Sequence ratio ``s_i = exp(sum_t mask*(logp - old_logp) / |y_i|)``;
GSPO-token ratio ``s_it = sg[s_i] * exp(logp_t - sg[logp_t])``;
``J_i = (1/|y_i|) * sum_t w_t * min(s_it*A_i, clip(s_it, 1-eps_low, 1+eps_high)*A_i)``;
``loss = -sum_i J_i / num_seqs``. Token advantages ``A_it`` (REINFORCE++) take the place of
``A_i`` in the token's term: GSPO-token's form, a sequence-level ratio with per-token credit.

Covered: sequence-level GSPO and GSPO-token with per-token weights (IBPO-mask, CIW) in one
function. With all ``w_t = 1`` the value of ``s_it`` is ``s_i`` for every t, so the min picks
the same branch on every token of a row, and
``d s_it / d theta = s_i * d logp_t / d theta``; averaging over t gives
``s_i * d log s_i / d theta = d s_i / d theta``. Hence GSPO-token with w = 1 has exactly the
value and gradient of ``min(s_i A_i, clip(s_i) A_i)``, and no separate sequence-level code
path is needed (tests/algorithms/test_gspo.py checks both against a direct implementation).

Choices the paper leaves open:
- ``|y_i|`` is clamped to >= 1: an empty row contributes 0 and never NaN.
- The denominator is ``num_seqs`` (default B): the paper's 1/G per prompt, summed over
  prompts of equal G, up to a constant; pass the global count under micro-batching
  (see ``aggregation.py``). ``num_tokens`` is accepted and ignored (common loss interface).
- No clamp on the log-ratio and no dual-clip: the length-normalised log-ratio is a mean, and
  the tiny clip range keeps updates small; computed in float32.
- Metrics for a batch without any valid token report clip_frac 0 and ratios 1.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ibpo_lit.algorithms.aggregation import per_token
from ibpo_lit.algorithms.registry import POLICY_LOSSES, LossInputs, LossSettings


def _masked(x: Tensor, valid: Tensor) -> Tensor:
    # where(), not x * mask: padding may hold -inf log-probs and 0 * inf is NaN.
    return torch.where(valid, x.float(), 0.0)


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    token_weights: Tensor | None = None,
    num_seqs: float | None = None,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO(-token) clipped surrogate, negated for minimisation.

    Args:
        logp: [B, T] log pi_theta of the sampled tokens (requires grad).
        old_logp: [B, T] log pi_old of the same tokens (treated as constant).
        advantages: [B] one advantage per sequence, or [B, T] one per token.
        mask: [B, T] bool (or 0/1), True on response tokens.
        eps_low, eps_high: clip range ``[1 - eps_low, 1 + eps_high]`` of the ratio.
        token_weights: [B, T] float ``w_t`` or None (all 1).
        num_seqs: global number of sequences the loss is averaged over (default B).
        num_tokens: ignored; accepted so every policy loss takes the same keywords.

    Returns:
        loss: [] float32 scalar ``-sum_i J_i / num_seqs``.
        metrics: detached [] float32 tensors "clip_frac" (share of non-empty sequences whose
            clipped branch is active; with token advantages each sequence counts the share of
            its tokens whose branch is), "ratio_mean", "ratio_max", "ratio_min" (``s_i`` over
            non-empty sequences).
    """
    del num_tokens  # GSPO always averages over sequences
    valid = mask != 0
    lengths = valid.sum(-1)  # [B]
    length = lengths.clamp_min(1).float()
    logp = _masked(logp, valid)
    old_logp = _masked(old_logp, valid)
    adv = per_token(advantages.float(), valid)  # [B, 1] or [B, T]

    log_seq_ratio = (logp - old_logp).sum(-1) / length  # [B] log s_i
    # s_it: value s_i, gradient through token t only (sg = detach).
    token_ratio = torch.exp(log_seq_ratio.detach()[:, None] + logp - logp.detach())  # [B, T]
    unclipped = token_ratio * adv
    clipped = token_ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)  # [B, T]

    weights = valid.float() if token_weights is None else _masked(token_weights, valid)
    objective = (surrogate * weights).sum(-1) / length  # [B] J_i
    denom = float(adv.shape[0]) if num_seqs is None else num_seqs
    loss = -objective.sum() / denom if denom else objective.sum() * 0.0

    with torch.no_grad():
        seq_ratio = log_seq_ratio.exp()
        nonempty = lengths > 0
        s = seq_ratio[:, None]
        clipped_tokens = ((adv > 0) & (s > 1.0 + eps_high)) | ((adv < 0) & (s < 1.0 - eps_low))  # [B, 1|T]
        # a sequence's share of clipped tokens: 0 or 1 with one advantage per sequence
        is_clipped = (clipped_tokens & valid).sum(-1) / length if adv.shape[1] > 1 else clipped_tokens[:, 0]
        if nonempty.any():
            r = seq_ratio[nonempty]
            metrics = {
                "clip_frac": is_clipped[nonempty].float().mean(),
                "ratio_mean": r.mean(),
                "ratio_max": r.max(),
                "ratio_min": r.min(),
            }
        else:
            one = torch.ones((), device=logp.device)
            metrics = {
                "clip_frac": torch.zeros((), device=logp.device),
                "ratio_mean": one,
                "ratio_max": one.clone(),
                "ratio_min": one.clone(),
            }
    return loss, metrics


@POLICY_LOSSES.register("gspo")
def gspo_policy_loss(inputs: LossInputs, settings: LossSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """``gspo_loss`` under the registry's contract (GSPO has no aggregation choice and no KL)."""
    return gspo_loss(inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask, settings.eps_low,
                     settings.eps_high, token_weights=inputs.token_weights, num_seqs=inputs.num_seqs,
                     num_tokens=inputs.num_tokens)
