"""DAPO's dynamic sampling: keep the informative groups of each generation round until the
update holds as many as configured (``AlgorithmConfig.dynamic_sampling``).

- ``informative_groups``: which prompts of an assembled step train at all (a non-zero
  advantage on one of their rows, correction samples included: a group IBPO shaped counts).
- ``select_groups`` / ``concat_steps``: a step cut to some of its groups, and steps joined
  into one, at the level the correction callback fills (prompts, rollouts, rewards,
  corrections); ``assemble_update`` is then run again on the result, so shaping and
  advantages keep one home (both are per group: a kept group's values do not change).
- ``InformativeGroups``: the rounds' bookkeeping and the decision, taken by every rank on the
  global counts. The update's groups are the first ``target`` informative groups in the order
  (round, rank, group), each rank taking its contiguous share: the rows one process would
  train, split as every other step of a multi-process run is.
- An update whose rounds reach ``max_rounds`` short of the target is not silent: rank 0 logs
  one WARNING line per such update (`shortfall_message`: how many were found, what the update
  trains, what to change), and ``train/missing_groups`` is the number it lacked (0 otherwise).

Why not verl's code: verl keeps the informative groups of a single-controller batch; here each
rank holds its own rows and the layout must match a single process, and ibpo-lit's corrections
ride along with their groups.
"""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from ibpo_lit.algorithms.advantages import rows_with_advantage
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.metric_reductions import SUM, reduction_of
from ibpo_lit.training.step_types import Corrections, ScoredRollouts

logger = logging.getLogger(__name__)



def informative_groups(step: ScoredRollouts) -> Tensor:
    """[P] bool: the prompts of an assembled ``step`` with a row of non-zero advantage."""
    if step.update is None:
        raise ValueError("informative_groups needs an assembled step (assemble_update first)")
    advantages = step.update.advantages.cpu()
    groups = step.rollouts.group_index.cpu()
    rows = [groups]
    corrections = step.corrections
    extra = len(advantages) - len(groups)
    if extra:  # correction samples trained jointly: each belongs to the group of the row it corrects
        if corrections is None or corrections.train_source is None or len(corrections.train_source) != extra:
            raise ValueError("an update row is neither a rollout nor a correction sample with a known source")
        rows.append(groups[corrections.train_source.cpu()])
    out = torch.zeros(len(step.prompts), dtype=torch.bool)
    out[torch.cat(rows)[rows_with_advantage(advantages)]] = True
    return out


def select_groups(step: ScoredRollouts, groups: Sequence[int]) -> ScoredRollouts:
    """``step`` cut to ``groups`` (prompt indices, in that order), renumbered from 0; shaping,
    advantages and the update are left to ``assemble_update``."""
    new_of = {int(g): new for new, g in enumerate(groups)}
    old_groups = step.rollouts.group_index.cpu().tolist()
    rows = [row for g in new_of for row, og in enumerate(old_groups) if og == g]
    rollouts = step.rollouts.select(rows)
    rollouts = replace(rollouts, group_index=torch.tensor([new_of[old_groups[r]] for r in rows],
                                                         dtype=torch.long, device=rollouts.group_index.device))
    corrections = None if step.corrections is None else _select_corrections(
        step.corrections, rows, old_groups, new_of, rollouts.response_ids.shape[1])
    return ScoredRollouts(prompts=[step.prompts[g] for g in new_of], rollouts=rollouts,
                          texts=[step.texts[r] for r in rows], rewards=step.rewards[rows], step=step.step,
                          corrections=corrections)


def _select_corrections(c: Corrections, rows: list[int], old_groups: list[int], new_of: dict[int, int],
                        width: int) -> Corrections:
    new_row = {old: new for new, old in enumerate(rows)}
    out = replace(c, rewards=c.rewards[rows], rewrite=c.rewrite[rows], kept_mask=c.kept_mask[rows][:, :width],
                  distance=c.distance[rows], metrics={})
    if c.train_batch is None or c.train_source is None:
        return replace(out, train_batch=None, train_rewards=None, train_source=None)
    # in the order of the rows they correct
    samples = sorted((s for s, row in enumerate(c.train_source.tolist()) if row in new_row),
                     key=lambda s: new_row[int(c.train_source[s])])
    source = c.train_source[samples].tolist()
    values = c.train_batch.group_index.cpu()[samples]
    if all(int(v) == old_groups[row] for v, row in zip(values.tolist(), source)):
        # grouped by prompt: the prompt's new index
        values = torch.tensor([new_of[old_groups[row]] for row in source], dtype=torch.long)
    else:  # grouped per correction input: any numbering that keeps the partition
        values = torch.unique(values, return_inverse=True)[1] if len(values) else values
    batch = c.train_batch.select(samples) if samples else None
    if batch is not None:
        batch = replace(batch, group_index=values.to(batch.group_index.device))
    return replace(out, train_batch=batch, train_rewards=c.train_rewards[samples] if samples else None,
                   train_source=torch.tensor([new_row[r] for r in source], dtype=torch.long) if samples else None)


def concat_steps(steps: Sequence[ScoredRollouts], pad_token_id: int) -> ScoredRollouts:
    """One step of ``steps``' groups, in order (prompt and row indices offset)."""
    if not steps:
        raise ValueError("concat_steps needs at least one step")
    offsets_p, offsets_r, p, r = [], [], 0, 0
    for s in steps:
        offsets_p.append(p)
        offsets_r.append(r)
        p, r = p + len(s.prompts), r + len(s.rollouts)
    rollouts = RolloutBatch.concat(
        [replace(s.rollouts, group_index=s.rollouts.group_index + off) for s, off in zip(steps, offsets_p)],
        pad_token_id=pad_token_id)
    with_corrections = [s.corrections is not None for s in steps]
    if any(with_corrections) and not all(with_corrections):
        raise ValueError("concat_steps: some steps have corrections and some do not")
    corrections = None
    if all(with_corrections):
        corrections = _concat_corrections([s.corrections for s in steps], offsets_p, offsets_r,
                                          rollouts.response_ids.shape[1], pad_token_id)
    return ScoredRollouts(prompts=[q for s in steps for q in s.prompts], rollouts=rollouts,
                          texts=[t for s in steps for t in s.texts], rewards=torch.cat([s.rewards for s in steps]),
                          step=steps[-1].step, corrections=corrections)


def _concat_corrections(parts: list[Corrections], offsets_p: list[int], offsets_r: list[int], width: int,
                        pad_token_id: int) -> Corrections:
    batches, rewards, sources = [], [], []
    next_group = 0
    for c, off_p, off_r in zip(parts, offsets_p, offsets_r):
        if c.train_batch is None or c.train_source is None or not len(c.train_batch):
            continue
        # Prompt-grouped samples keep their prompt's index; per-input groups stay apart.
        shift = max(off_p, next_group)
        batches.append(replace(c.train_batch, group_index=c.train_batch.group_index + shift))
        next_group = int(batches[-1].group_index.max()) + 1
        rewards.append(c.train_rewards)
        sources.append(c.train_source + off_r)
    pad = [torch.nn.functional.pad(c.kept_mask, (0, width - c.kept_mask.shape[1]), value=False) for c in parts]
    return Corrections(
        rewards=torch.cat([c.rewards for c in parts]), rewrite=torch.cat([c.rewrite for c in parts]),
        kept_mask=torch.cat(pad), distance=torch.cat([c.distance for c in parts]), alpha=parts[-1].alpha,
        train_batch=RolloutBatch.concat(batches, pad_token_id) if batches else None,
        train_rewards=torch.cat(rewards) if rewards else None, train_source=torch.cat(sources) if sources else None,
        generated_tokens=sum(c.generated_tokens for c in parts), prompt_tokens=sum(c.prompt_tokens for c in parts),
    )


class InformativeGroups:
    """The informative groups of the rounds so far, on this rank, and when to update.

    Args:
        max_rounds: Generation rounds per update at most.
    """

    def __init__(self, max_rounds: int) -> None:
        self.max_rounds = max_rounds
        self.reset()

    def reset(self) -> None:
        self.kept: list[tuple[int, ScoredRollouts]] = []  # (round, that round's informative groups)
        self.rounds = 0
        self.total = 0  # informative groups of every rank, all rounds
        self.filtered = 0  # uninformative groups dropped, this rank
        self.round_metrics: list[dict[str, float]] = []
        self.used = 0  # informative groups the update trains (all ranks)
        self.target = 0  # informative groups an update wants (all ranks)

    def add(self, step: ScoredRollouts, metrics: dict[str, float], sync, rank: int = 0, *,
            pad_token_id: int) -> Optional[ScoredRollouts]:
        """Take an assembled round (and its ``assemble_update`` metrics); the step to update on
        once enough informative groups are in (or the cap is reached), else None. Every rank
        calls it every round, with the run's ``RankSync`` (one collective per round, one gather
        at the update), and gets the same answer. ``pad_token_id`` pads the joined rollouts (the
        tokenizer's: given here, like `assemble_update`'s, so the filter is whole from the
        start)."""
        keep = informative_groups(step)
        groups = torch.nonzero(keep).flatten().tolist()
        if groups:
            self.kept.append((self.rounds, select_groups(step, groups)))
        self.rounds += 1
        self.filtered += len(step.prompts) - len(groups)
        self.round_metrics.append(metrics)
        world = sync.world_size if sync.active else 1
        target = self.target = len(step.prompts) * world
        (found,) = sync.sum([float(len(groups))])
        self.total += int(found)
        if self.total < target and self.rounds < self.max_rounds:
            return None
        if self.total < target and rank == 0:  # the cap, short: say so, once per such update
            logger.warning(shortfall_message(self.total, target, self.rounds, world))
        if self.total < world:  # too few to give every process a group: the last round as it is
            return step
        everyone = sync.gather(self.kept)  # [rank] -> [(round, step)]
        ordered = [s for round_ in range(self.rounds) for mine in everyone for r, s in mine if r == round_]
        joined = concat_steps(ordered, pad_token_id)
        self.used = min(self.total, target)
        share = torch.arange(self.used).tensor_split(world)[rank if world > 1 else 0].tolist()
        return select_groups(joined, share)

    def metrics(self) -> dict[str, float]:
        """The rounds' metrics (counts summed, the rest averaged) and dynamic sampling's own;
        then ``reset`` for the next update."""
        out: dict[str, float] = {}
        for key in {k for m in self.round_metrics for k in m}:
            values = [m[key] for m in self.round_metrics if key in m and not math.isnan(m[key])]
            if values:
                # counts (declared `sum`) add up over the rounds; the rest is averaged
                out[key] = sum(values) if reduction_of(key) == SUM else sum(values) / len(values)
        out.update({"train/filtered_groups": float(self.filtered), "train/generation_rounds": float(self.rounds),
                    "train/informative_groups": float(self.total), "train/trained_groups": float(self.used),
                    "train/missing_groups": float(max(self.target - self.used, 0))})
        self.reset()
        return out

    def state_dict(self) -> dict[str, Any]:
        """The rounds in progress (a checkpoint taken between two updates resumes them; ``target``
        is set again by the next round)."""
        return {"kept": self.kept, "rounds": self.rounds, "total": self.total, "filtered": self.filtered,
                "round_metrics": self.round_metrics}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()
        for key, value in state.items():
            setattr(self, key, value)


def shortfall_message(found: int, wanted: int, rounds: int, world: int) -> str:
    """One line for an update whose ``rounds`` reached ``max_rounds`` with ``found`` of the
    ``wanted`` informative groups (over ``world`` processes): what happened and what to do."""
    fixes = ("Raise model.algorithm.dynamic_sampling.max_rounds, make the task harder or easier for the model, "
             "or turn dynamic sampling off")
    if found == 0:
        return (f"dynamic sampling: 0 informative groups in {rounds} round(s) (in every group the rewards were "
                f"all equal, e.g. all right or all wrong, or unscorable); this update trains on nothing. {fixes}")
    if found < world:
        return (f"dynamic sampling: {found} informative group(s) of {wanted} wanted in {rounds} round(s), fewer than "
                f"the {world} processes; this update trains on the last round as it is. {fixes}")
    return (f"dynamic sampling: {found} informative group(s) of {wanted} wanted in {rounds} round(s) (the others' "
            f"rewards were all equal); this update trains on those {found}. {fixes}")
