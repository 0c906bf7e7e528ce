"""Each step's prompts with the next step's: what one step off-policy generation samples ahead.

With ``model.rollout.max_staleness: 1`` (``ibpo_lit.training.off_policy``) step t generates step
t+1's rollouts while it updates, so it needs step t+1's prompts before Lightning hands them. The
data module (``data.steps_ahead: 1``, linked to ``max_staleness`` on the command line) then
yields `StepPrompts` ``(now, ahead)``: step t's prompts and step t+1's, the latter again as
``now`` of the next batch. Only ``now`` counts as consumed (`PromptDataModule.mark_consumed`), so
a checkpoint resumes the stream at step t+1, whose batch in flight the checkpoint holds.

What is not covered: more than one step ahead; ``num_workers > 0`` (refused by the data module).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple

from torch.utils.data import IterableDataset

from ibpo_lit.data.prompt import Prompt


class StepPrompts(NamedTuple):
    """One training step's batch when the engine samples one step ahead."""

    now: list[Prompt]  # this step's prompts (P)
    ahead: list[Prompt]  # the next step's prompts (P), sampled during this step's update


def steps_with_lookahead(prompts: Iterator[Prompt], per_step: int) -> Iterator[StepPrompts]:
    """``(step t's, step t+1's)`` for t = 0, 1, ... from an endless prompt stream."""
    steps = iter(lambda: list(itertools.islice(prompts, per_step)), [])
    now = next(steps, None)
    for ahead in steps:
        if len(ahead) < per_step:  # a finite stream's end: no full next step
            return
        yield StepPrompts(now, ahead)
        now = ahead


class LookAheadSteps(IterableDataset):
    """Whole steps' `StepPrompts` from a prompt dataset (a DataLoader over it batches nothing)."""

    def __init__(self, prompts: IterableDataset, per_step: int) -> None:
        self.prompts, self.per_step = prompts, per_step

    def __iter__(self) -> Iterator[StepPrompts]:
        return steps_with_lookahead(iter(self.prompts), self.per_step)


def as_is(item: StepPrompts) -> StepPrompts:
    """DataLoader collate for whole steps (module level: picklable)."""
    return item
