"""`Deadline`: a time limit on one phase of work that every rank agrees has passed, or not.

Work a rank cannot kill (a forward of a model in the trainer's own process, a ``generate`` of
the rollout engine) is bounded by checking a clock between its units (batches, calls). Under
FSDP2 and tensor parallelism those units are collectives: a rank that gave up alone would leave
the others waiting in the next one for ever. So the check is itself a collective, called by
every rank at the same points: each rank says whether its own clock is past the limit, and all
learn which ranks are. From the first check that finds one, every rank stops at the same unit.

What is covered:
    * ``passed()``: one small all-reduce (`RankSync.sum` of a flag per rank) per check, none
      without a limit (``seconds=None``: every rank has the same setting) or once the limit has
      passed (every rank saw the same answer), so callers may check freely at agreed points.
    * ``message()``: names this rank, the ranks whose clocks were past the limit, the phase, the
      limit, the seconds spent here and the weights' version the work ran under. ``check()``
      raises `DeadlineExceeded` with it, for a caller that gives up with an error.
    * The clock is ``time.monotonic`` (a test may hand in another).

What is not covered:
    * A unit that never returns (a hung collective, a deadlocked kernel): it is not interrupted;
      the check comes after it. Such hangs need a process that can be killed (the worker pools
      of ``ibpo_lit.rewards``) or the launcher's own timeout.
    * Ranks that call ``passed()`` a different number of times: the caller's loop must be agreed
      first (`RankSync.max`), as for any collective.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Optional

import torch

from ibpo_lit.scale.collectives import SINGLE_PROCESS, RankSync


class DeadlineExceeded(TimeoutError):
    """A phase passed its time limit (the message names rank, phase and weights' version)."""


def process_rank() -> int:
    """This process's rank in the run (0 without a process group)."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class Deadline:
    """A time limit, starting now, on the phase ``phase``, agreed over ``sync``.

    Args:
        phase: What is being timed, for the message (``"judge:correctness scoring"``).
        seconds: The limit; None: no limit (``passed()`` is always False and communicates nothing).
        sync: The ranks that must agree (their collectives); `SINGLE_PROCESS` for work no other
            rank waits on.
        version: The weights' version the work runs under (optimizer steps taken), for the message.
        clock: Seconds, monotonic.
    """

    def __init__(self, phase: str, seconds: Optional[float], sync: RankSync = SINGLE_PROCESS,
                 version: Optional[int] = None, clock: Callable[[], float] = time.monotonic) -> None:
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not math.isfinite(seconds) or seconds <= 0):
            raise ValueError(f"{phase}: a time limit must be a finite number of seconds > 0 or None, got {seconds!r}")
        self.phase, self.seconds, self.sync, self.version, self.clock = phase, seconds, sync, version, clock
        self.started = clock()
        self.late_ranks: tuple[int, ...] = ()  # the ranks whose clocks were past the limit

    @property
    def elapsed(self) -> float:
        """Seconds since the deadline was set, on this rank."""
        return self.clock() - self.started

    def passed(self) -> bool:
        """Whether some rank's clock is past the limit: a collective over ``sync`` (module docstring)."""
        if self.seconds is None:
            return False
        if self.late_ranks:
            return True
        late = self.elapsed > self.seconds
        if not self.sync.active:
            self.late_ranks = (process_rank(),) if late else ()
            return late
        rank = process_rank()
        flags = self.sync.sum([float(late and r == rank) for r in range(self.sync.world_size)])
        self.late_ranks = tuple(r for r, flag in enumerate(flags) if flag > 0)
        return bool(self.late_ranks)

    def message(self) -> str:
        late = ", ".join(str(r) for r in self.late_ranks) or "none"
        version = "unknown" if self.version is None else self.version
        return (f"rank {process_rank()}: {self.phase} passed its time limit of {self.seconds:g} s (past it on rank(s) "
                f"{late}; {self.elapsed:.1f} s on this rank), weights version {version}")

    def check(self) -> None:
        """Raise `DeadlineExceeded` (with `message`) when `passed`; a collective as `passed` is."""
        if self.passed():
            raise DeadlineExceeded(self.message())
