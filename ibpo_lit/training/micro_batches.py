"""How the trainer cuts rows into micro-batches, and the input of a padding pass.

What is covered:
    * ``micro_batches``: rows (in the order given, typically sorted by length) cut into
      contiguous micro-batches of at most ``max_rows`` rows and, with a token budget, at most
      ``max_tokens`` tokens, counted as the padded per-row forward sees them: rows x (longest
      prompt + longest response) of the micro-batch. That is an upper bound on what the
      shared-prompt forward (``training/logprobs.py``) sees, which forwards each distinct
      prompt once and pads each response bucket to its own longest. A row longer than the
      budget gets a micro-batch of its own (a row is never split). Without a budget: today's
      cut, ``rows.split(max_rows)``, exactly. Packed (``rollout.packing``), the budget counts
      real tokens instead, the sum of the rows' prompt + response lengths (the packed
      sequence's length plus one per row: a row's last token is not forwarded).
    * ``length_order``: the rows of a batch shortest first (prompt + response, stable), the
      order in which a token budget packs the most rows per pass.
    * ``one_token_row``: the input of a padding pass (a rank that has run out of micro-batches
      while another has not, under FSDP2 or DDP where every forward or backward is a
      collective): one row of one prompt token and one response token, so a pass that trains
      nothing costs two positions instead of a full-length row.

What is not covered:
    * Balancing lengths across ranks (verl's ``balance_batch``): prompts are dealt to ranks
      before their responses exist (``data/stream.py``), so each rank generates rows of its
      own lengths; ``rollout.balance_ranks`` deals a mini-batch's rows anew before this cut
      (``training/rank_balance.py``, wired in ``training/update.py``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
from torch import Tensor

from ibpo_lit.rollout.batch import RolloutBatch


def micro_batches(rows: Tensor, prompt_lengths: Tensor, response_lengths: Tensor, max_rows: int,
                  max_tokens: Optional[int] = None, packed: bool = False) -> list[Tensor]:
    """``rows`` [n] (indices) cut, in their order, into contiguous micro-batches of at most
    ``max_rows`` rows and, when ``max_tokens`` is set, at most ``max_tokens`` padded tokens
    (``len(micro) * (max prompt length + max response length)`` over its rows; ``packed``: the
    sum of their prompt + response lengths instead; a single row over the budget goes alone).
    ``prompt_lengths`` / ``response_lengths``: every row's real lengths, indexed by ``rows``. None when ``rows`` is empty (``torch.split`` of an empty tensor
    yields one empty chunk)."""
    if not len(rows):
        return []
    if max_tokens is None:
        return list(rows.split(max_rows))
    prompts, responses = prompt_lengths[rows].tolist(), response_lengths[rows].tolist()
    out, start, longest_prompt, longest_response, real = [], 0, 0, 0, 0
    for i, (p, r) in enumerate(zip(prompts, responses)):
        count = i - start + 1
        wider_prompt, wider_response, more = max(longest_prompt, p), max(longest_response, r), real + p + r
        tokens = more if packed else count * (wider_prompt + wider_response)
        if count > 1 and (count > max_rows or tokens > max_tokens):
            out.append(rows[start:i])
            start, wider_prompt, wider_response, more = i, p, r, p + r
        longest_prompt, longest_response, real = wider_prompt, wider_response, more
    out.append(rows[start:])
    return out


def length_order(batch: RolloutBatch, rows: Optional[Tensor] = None) -> Tensor:
    """``rows`` (default: every row of ``batch``) sorted by prompt + response length, shortest
    first, ties in their given order."""
    if rows is None:
        rows = torch.arange(len(batch), device=batch.response_ids.device)
    lengths = batch.response_mask[rows].sum(dim=1) + batch.prompt_mask[rows].sum(dim=1)
    return rows[torch.argsort(lengths, stable=True)]


def row_lengths(batch: RolloutBatch) -> tuple[Tensor, Tensor]:
    """(prompt lengths [B], response lengths [B]) of ``batch``'s rows, real tokens only."""
    return batch.prompt_mask.sum(dim=1), batch.response_mask.sum(dim=1)


def one_token_row(batch: RolloutBatch) -> RolloutBatch:
    """A padding pass's input: ``batch``'s first row cut to its last prompt column and its first
    response column, both marked real (and not tool output), whatever they held. The pass's
    loss is multiplied by 0 and its outputs are discarded: only its cost matters, and that it
    runs every layer (the collectives FSDP2 hooks on each layer's forward and backward)."""
    row = replace(batch, **{name: value[:1] for name, value in vars(batch).items() if isinstance(value, Tensor)})
    return replace(
        row,
        prompt_ids=row.prompt_ids[:, -1:],
        prompt_mask=torch.ones_like(row.prompt_mask[:, -1:]),
        response_ids=row.response_ids[:, :1],
        response_mask=torch.ones_like(row.response_mask[:, :1]),
        rollout_logp=row.rollout_logp[:, :1],
        tool_mask=torch.zeros_like(row.tool_mask[:, :1]) if row.tool_mask is not None else None,
    )
