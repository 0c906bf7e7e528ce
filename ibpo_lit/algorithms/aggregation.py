"""How a [B, T] matrix of per-token losses becomes one scalar (STYLE section 2).

Modes (``AGGREGATIONS``):
- "token-mean" (DAPO): ``sum_{i,t} loss*mask / num_tokens``, default ``num_tokens = mask.sum()``;
- "seq-mean-token-mean" (GRPO): ``sum_i (sum_t loss*mask / max(len_i, 1)) / num_seqs``,
  default ``num_seqs = B``;
- "seq-mean-token-sum" (Dr.GRPO-like): ``sum_i sum_t loss*mask / num_seqs``.

Gradient accumulation: every mode is a SUM over rows divided by one batch-wide denominator.
A caller that splits a batch into micro-batches must pass the GLOBAL ``num_seqs`` /
``num_tokens`` of the whole batch; then the micro-batch losses (and their gradients) SUM to
the full-batch loss exactly. Letting each micro-batch default to its own counts and
averaging the results weights tokens of short micro-batches more (the classic TRL
gradient-accumulation bug). ``len_i`` is per row, so it never needs a global value.

Choices: a float mask acts as per-token weights, ``len_i`` and the default ``num_tokens`` are
then sums of weights. A zero denominator (an all-padding batch) gives loss 0, not NaN.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ibpo_lit.algorithms.registry import AGGREGATIONS


def _div(numerator: Tensor, denominator: float | Tensor) -> Tensor:
    """``numerator / denominator``, with 0 instead of NaN when the denominator is 0."""
    den = torch.as_tensor(denominator, dtype=numerator.dtype, device=numerator.device)
    return numerator / torch.where(den > 0, den, torch.ones_like(den))


@AGGREGATIONS.register("token-mean")
def _token_mean(loss_mat: Tensor, mask: Tensor, num_seqs, num_tokens) -> Tensor:
    total = (loss_mat * mask).sum()
    return _div(total, mask.sum() if num_tokens is None else num_tokens)


@AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: Tensor, mask: Tensor, num_seqs, num_tokens) -> Tensor:
    per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    return _div(per_seq.sum(), loss_mat.shape[0] if num_seqs is None else num_seqs)


@AGGREGATIONS.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: Tensor, mask: Tensor, num_seqs, num_tokens) -> Tensor:
    per_seq = (loss_mat * mask).sum(-1)
    return _div(per_seq.sum(), loss_mat.shape[0] if num_seqs is None else num_seqs)


def per_token(adv: Tensor, valid: Tensor) -> Tensor:
    """[B] advantages as [B, 1] (broadcast over tokens), [B, T] as they are, checked."""
    if adv.dim() == 1 and adv.shape[0] == valid.shape[0]:
        return adv[:, None]
    if adv.shape == valid.shape:
        return torch.where(valid, adv, 0.0)
    raise ValueError(f"advantages must be [B] or [B, T] like the mask {tuple(valid.shape)}; got {tuple(adv.shape)}")


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    num_seqs: float | None = None,
    num_tokens: float | None = None,
) -> Tensor:
    """Reduce per-token losses to a scalar.

    Args:
        loss_mat: [B, T] per-token loss (values on padding are ignored).
        mask: [B, T] bool or float, True/weight on tokens that count.
        mode: a name in ``AGGREGATIONS``.
        num_seqs: global number of sequences of the whole batch (default: B).
        num_tokens: global (weighted) token count of the whole batch (default: mask.sum()).

    Returns:
        [] the aggregated loss, dtype of ``loss_mat`` (at least float32).
    """
    fn = AGGREGATIONS.get(mode)
    if loss_mat.shape != mask.shape or loss_mat.dim() != 2:
        raise ValueError(
            f"loss_mat and mask must both be [B, T]; got {tuple(loss_mat.shape)} "
            f"and {tuple(mask.shape)}"
        )
    dtype = torch.promote_types(loss_mat.dtype, torch.float32)
    # where() rather than multiply-by-0 alone, so NaN/inf on padding cannot leak in.
    loss_mat = torch.where(mask != 0, loss_mat.to(dtype), 0.0)
    return fn(loss_mat, mask.to(dtype), num_seqs, num_tokens)
