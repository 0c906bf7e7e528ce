"""Rows dealt to ranks by length, so each micro-batch index costs about the same on every rank.

Why: under DDP / FSDP2 every backward (and under FSDP2 every forward) is a collective, so the
ranks run their micro-batches in lockstep and pass ``i`` lasts as long as the slowest rank's
pass ``i``; a rank that ran out pads with one-token passes. Each rank generates (and, without
this, trains) the rows of its own prompts, so one rank's long responses decide everyone's time.
``rollout.balance_ranks`` gathers a mini-batch's rows from every rank and deals them anew
(``training/update.py``); the loss is a sum over the mini-batch's rows with denominators
counted over every rank, so only the order of float sums changes.

What is covered:
    * ``deal``: units (a row, or a group of rows) sorted by cost, longest first, and dealt
      in a snake order (rank 0, 1, ..., W-1, W-1, ..., 1, 0, 0, 1, ...): every rank gets as
      many units as any other, give or take one, and since each rank cuts its rows into
      micro-batches shortest first (``training/micro_batches.py``), its k-th shortest unit is
      about as long as every other rank's: the micro-batches of one index hold rows of about
      the same lengths. The totals differ by at most the longest unit. verl's
      ``balance_batch`` uses Karmarkar-Karp on the totals alone, which can give one rank few
      long rows and another many short ones (different micro-batch counts under a row cap).
    * ``units_of``: which rows travel together: each row alone when packed (a packed row
      carries its own prompt), else the rows of one prompt (same rank, same ``group_index``),
      so the shared-prompt forward (``training/logprobs.py``) still forwards it once.

The deal comes first in ``PolicyUpdate.run``: the no-grad forwards before the optimizer steps
(pi_old with several mini-batches, the reference's log-probs, the mismatch probe) run on the
dealt rows as well.

What is not covered:
    * The forwards before the update (rollouts, rewards, corrections, CIW's scoring) run on
      each rank's own rows: the deal is the update's.
    * Metrics averaged over ranks (``train/ratio_mean``, ``rollout/logprob_mismatch``) are
      means of per-rank means, so they move with the deal (the loss and gradient do not).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def deal(costs: Sequence[float], parts: int) -> list[list[int]]:
    """The unit indices (ascending) each of ``parts`` ranks gets: ``costs`` sorted descending
    (ties: the lower index first) and dealt in snake order (see the module docstring)."""
    if parts < 1:
        raise ValueError(f"deal: parts must be >= 1, got {parts}")
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    out: list[list[int]] = [[] for _ in range(parts)]
    for position, unit in enumerate(order):
        lap, seat = divmod(position, parts)
        out[seat if lap % 2 == 0 else parts - 1 - seat].append(unit)
    return [sorted(part) for part in out]


def units_of(rows: Tensor, source_rank: Tensor, group_index: Tensor, by_row: bool) -> Tensor:
    """[n] long: the unit (0..U-1) of each of ``rows`` (indices into ``source_rank`` and
    ``group_index``, the rank each row came from and its prompt there): each row its own
    (``by_row``), else one unit per (rank, prompt), numbered in order of first appearance."""
    if by_row:
        return torch.arange(len(rows))
    keys = [(int(r), int(g)) for r, g in zip(source_rank[rows].tolist(), group_index[rows].tolist())]
    numbering: dict[tuple[int, int], int] = {}
    return torch.tensor([numbering.setdefault(key, len(numbering)) for key in keys], dtype=torch.long)


def balanced_rows(rows: Tensor, lengths: Tensor, units: Tensor, parts: int) -> list[Tensor]:
    """``rows`` (indices) dealt to ``parts`` ranks: their ``units`` (as `units_of` numbers them)
    dealt by cost, a unit's cost the sum of its rows' ``lengths`` (indexed by ``rows``' values);
    each rank's rows in their order in ``rows``."""
    count = int(units.max()) + 1 if len(units) else 0
    costs = torch.zeros(count, dtype=torch.float64).index_add_(0, units, lengths[rows].double()).tolist()
    out = []
    for part in deal(costs, parts):
        mine = torch.isin(units, torch.tensor(part, dtype=torch.long))
        out.append(rows[mine.to(rows.device)])
    return out
