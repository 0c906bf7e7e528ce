"""Packed rows: a micro-batch's rows laid end to end in one sequence, no padding at all.

What is covered:
    * ``pack_rows``: the layout of a ``RolloutBatch`` packed into one row [1, N]: each row's real
      prompt tokens and its response but the last token (that one predicts nothing trained),
      row after row; ``position_ids`` restart at 0 on every row; and the K positions (one per
      response token) whose logits give its log-prob, in the order of ``response_mask``'s True
      entries (row-major), so ``out[response_mask] = ...`` puts every value back in its row.
    * ``packing_attention`` / ``packs``: whether a model keeps attention within each packed row.
      transformers (5.x) does it from the restarting ``position_ids`` alone when the forward
      gets no 2-D attention mask and no cache (``masking_utils.find_packed_sequence_indices``):
      flash-attention's varlen kernels get the rows' boundaries (``cu_seqlens``,
      ``modeling_flash_attention_utils._is_packed_sequence``); flex attention a block mask (its
      kernel skips the blocks between rows); SDPA and eager a dense block-diagonal causal mask
      (N x N: attention over the whole packed sequence, masked). Any other attention (a custom
      or paged kernel) would attend across rows, so ``packing: on`` refuses it, and ``auto``
      packs only where the kernel skips the other rows (flash-attention, flex).

What is not covered:
    * Models whose masks do not come from ``transformers.masking_utils`` (remote code with its
      own mask): the check reads ``config._attn_implementation`` only.
    * Speed under SDPA / eager: the dense mask makes attention quadratic in the packed length
      instead of each row's; on an H200 a packed SDPA forward + backward took twice the padded
      one, and flex attention's half (docs/benchmarks.md#packed-forwards). Memory too: on the
      CPU, SDPA's packed attention holds O(N^2) bytes while a layer runs (an 8k-token packed
      row, tiny-wide model: about 320 MiB more than the padded forward); the plan
      (``python -m ibpo_lit plan``, ``plan/memory.py`` ``packed_attention_bytes``) counts the
      N x N masks SDPA and eager keep for backward. Flash-attention's varlen path has not run
      (flash-attn is not installed on the machines tried).
    * Prompt sharing: each row forwards its own copy of its prompt (a group's G rows, G copies),
      where the shared-prompt path (``training/logprobs.py``) forwards it once.
    * Rows with an empty prompt: the first response token has no position to be predicted
      from; ``pack_rows`` refuses them (the caller falls back to the padded forward).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ibpo_lit.models.attention import (  # noqa: F401  (re-exported: the rule's home is models/, which plan/ may import)
    BLOCK_ATTENTION,
    DENSE_ATTENTION,
    VARLEN_ATTENTION,
    attention_kind,
    packs_under,
)
from ibpo_lit.rollout.batch import RolloutBatch

PACKING_MODES = ("off", "on", "auto")


@dataclass
class PackedRows:
    """One packed sequence and where its response log-probs come from."""

    input_ids: Tensor  # [1, N] long
    position_ids: Tensor  # [1, N] long, 0 at the start of every row
    predicting: Tensor  # [K] long, the position whose logits predict each response token
    targets: Tensor  # [1, K] long, the response tokens (batch.response_ids[batch.response_mask])


def pack_rows(batch: RolloutBatch) -> Optional[PackedRows]:
    """``batch``'s rows packed end to end (see the module docstring); None when there is no
    response token to predict or a row with a response has no prompt token."""
    response_mask = batch.response_mask.bool()
    prompt_lengths = batch.prompt_mask.sum(dim=1)
    response_lengths = response_mask.sum(dim=1)
    if not bool(response_mask.any()) or bool(((prompt_lengths == 0) & (response_lengths > 0)).any()):
        return None
    has_response = (response_lengths > 0).unsqueeze(1)
    columns = torch.arange(response_mask.shape[1], device=response_mask.device)
    # A row's tokens in the sequence: its real prompt, then its response but the last token. Rows
    # with no response token add nothing (no log-prob of theirs is asked for).
    forwarded = torch.cat([batch.prompt_mask.bool() & has_response,
                           response_mask & (columns < response_lengths.unsqueeze(1) - 1)], dim=1)
    ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
    # Row-major boolean indexing keeps each row's tokens in order and the rows in theirs.
    input_ids = ids[forwarded].unsqueeze(0)
    position_ids = (forwarded.long().cumsum(dim=1) - 1)[forwarded].unsqueeze(0)
    flat_index = forwarded.reshape(-1).long().cumsum(dim=0).reshape(forwarded.shape) - 1
    lp = batch.prompt_ids.shape[1]
    # Column Lp - 1 + t (the last prompt token, then response token t - 1) predicts response token t.
    predicting = flat_index[:, lp - 1: lp - 1 + response_mask.shape[1]][response_mask]
    return PackedRows(input_ids, position_ids, predicting, batch.response_ids[response_mask].unsqueeze(0))


def packing_attention(model: torch.nn.Module) -> Optional[str]:
    """`attention_kind` of ``model``'s attention implementation."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return attention_kind(getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None))


def packs(model: torch.nn.Module, packing: str) -> bool:
    """Whether ``model``'s forwards are packed under ``rollout.packing``: ``on`` always (an
    error where its attention would cross rows), ``auto`` where the attention kernel skips the
    other rows (flash-attention's varlen, flex attention), ``off`` never."""
    if packing not in PACKING_MODES:
        raise ValueError(f"rollout.packing must be one of {PACKING_MODES}, got {packing!r}")
    if packing == "off":
        return False
    kind = packing_attention(model)
    if packing == "on" and kind is None:
        config = getattr(model, "config", None)
        raise ValueError(
            "rollout.packing: on needs an attention implementation that keeps packed rows apart "
            f"({', '.join(VARLEN_ATTENTION + BLOCK_ATTENTION + DENSE_ATTENTION)}); this model's is "
            f"{getattr(config, '_attn_implementation', None)!r}. Set rollout.packing: off or auto.")
    return packs_under(packing, kind)
