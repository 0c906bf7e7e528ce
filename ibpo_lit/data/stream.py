"""An endless, resumable stream of prompts: problem sources and the `IterableDataset` over them.

What is covered:
- `RecordSource`: epochs over in-memory records, each epoch shuffled by its own generator,
  seeded ``seed * 1_000_003 + epoch`` (seed 0: ``epoch``, the orders of every run before the
  seed followed ``seed_everything``; a plain ``seed + epoch`` would give seed 1 the epochs of
  seed 0 shifted by one).
- `ArithmeticSource`: problems 0, 1, 2, ... of `arithmetic_problem` (one endless epoch).
- `PromptStream`: the dataset. It starts at a `StreamPosition` ``(epoch, index)`` and tags every
  prompt with ``meta["stream_position"]``, the position just after it, so whoever sees a batch
  consumed knows where to resume. A position counts problems drawn from the source, including
  those the prompt builder skipped as too long, so resuming replays the same problems exactly.

What is not covered:
- Exactness with ``num_workers > 0``: workers split the stream round-robin by draw count
  (worker w takes draws w, w+W, ...), so batches no longer follow the single-process order and a
  resume from the furthest consumed position may drop or repeat a few prompts.
"""
from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from torch.utils.data import IterableDataset, get_worker_info

from ibpo_lit.data.arithmetic import ArithmeticConfig, arithmetic_problem
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.data.prompt_builder import PromptBuilder
from ibpo_lit.data.records import Record


@dataclass(frozen=True, order=True)
class StreamPosition:
    epoch: int = 0  # passes over a finite source so far
    index: int = 0  # problems drawn in the current epoch

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}


@dataclass(frozen=True)
class Problem:
    problem: str
    gold: str | None
    uid: str
    after: StreamPosition  # the stream position just after this problem
    columns: dict = field(default_factory=dict)  # the record's other fields (`Prompt.columns`)
    messages: list[dict] | None = None  # a conversational problem (`Record.messages`)


class ProblemSource(Protocol):
    epoch_size: int | None  # problems per epoch; None for an endless source

    def problems_from(self, start: StreamPosition) -> Iterator[Problem]: ...


class RecordSource:
    """Epochs over a fixed list of records, epoch ``e`` shuffled with ``seed * 1_000_003 + e``."""

    def __init__(self, records: Sequence[Record], seed: int = 0):
        if not records:
            raise ValueError("RecordSource needs at least one record")
        self.records, self.seed = records, seed
        self.epoch_size = len(records)

    def order(self, epoch: int) -> list[int]:
        perm = list(range(len(self.records)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(perm)
        return perm

    def problems_from(self, start: StreamPosition) -> Iterator[Problem]:
        epoch, index = start.epoch, start.index
        while True:
            perm = self.order(epoch)
            for i in range(index, len(perm)):
                r = self.records[perm[i]]
                yield Problem(r.problem, r.gold, r.uid, StreamPosition(epoch, i + 1), r.columns, r.messages)
            epoch, index = epoch + 1, 0


class ArithmeticSource:
    """Problem i of the synthetic arithmetic stream at index i; one endless epoch."""

    epoch_size = None

    def __init__(self, cfg: ArithmeticConfig):
        self.cfg = cfg

    def problems_from(self, start: StreamPosition) -> Iterator[Problem]:
        for i in itertools.count(start.index):
            text, gold = arithmetic_problem(i, self.cfg)
            yield Problem(text, gold, f"arithmetic:{i}", StreamPosition(start.epoch, i + 1), {"answer": gold})


class PromptStream(IterableDataset):
    """Endless `Prompt`s from a source, beginning at ``start``."""

    def __init__(
        self,
        source: ProblemSource,
        builder: PromptBuilder,
        start: StreamPosition = StreamPosition(),
        rank: int = 0,
        world_size: int = 1,
        per_rank: int = 1,
    ):
        self.source, self.builder, self.start = source, builder, start
        self.rank, self.world_size, self.per_rank = rank, world_size, per_rank

    def __iter__(self) -> Iterator[Prompt]:
        if self.world_size <= 1:
            yield from self._prompts()
            return
        # Several processes: every rank reads the whole stream and keeps its slice of each
        # global batch (world_size x per_rank prompts), so the ranks never share a prompt and
        # each prompt carries the position after the *global* batch: a checkpoint (written by
        # rank 0) resumes every rank exactly after the last step.
        chunk: list[Prompt] = []
        for prompt in self._prompts():
            chunk.append(prompt)
            if len(chunk) == self.world_size * self.per_rank:
                end = chunk[-1].meta["stream_position"]
                for mine in chunk[self.rank * self.per_rank : (self.rank + 1) * self.per_rank]:
                    mine.meta["stream_position"] = end
                    yield mine
                chunk = []

    def _prompts(self) -> Iterator[Prompt]:
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        max_skips = max(self.source.epoch_size or 0, 1000)
        skips = 0
        for draw, p in enumerate(self.source.problems_from(self.start)):
            if draw % n_workers != worker:
                continue
            prompt = self.builder.build(p.problem, p.gold, p.uid, p.columns, p.messages)
            if prompt is None:
                skips += 1
                if skips > max_skips:
                    raise ValueError(
                        f"{skips} prompts in a row exceed max_prompt_tokens="
                        f"{self.builder.max_prompt_tokens}; raise it or use on_long_prompt='truncate'"
                    )
                continue
            skips = 0
            prompt.meta["stream_position"] = p.after.as_dict()
            yield prompt
