"""`SandboxPool`: at most ``num_workers`` programs in their sandboxes at once, statuses counted.

What is covered:
- ``pool.run(pairs)`` / ``pool.score(pairs)`` over (completion, gold) pairs, gold being
  ``CodeTests.to_gold()``; ``pool.submit(completion, gold)`` returns a future, so scoring can
  overlap generation. Results keep the order of ``pairs``.
- Each run occupies one thread that waits on its judge process; the time limits are enforced by
  killing processes (the judge's deadline, and the caller's kill of the judge), never by the
  thread, so a slow program holds one slot for at most its ``timeout_s`` plus a grace period,
  and a batch of n programs takes at most about ``ceil(n / num_workers)`` such periods.
- ``pool.stats``: counts of ``pass``, ``fail``, ``timeout``, ``memory``, ``error`` and
  ``unscorable`` (bad gold, the harness failed, or the sandbox cannot run on this host at all:
  `SandboxUnavailable`), since the pool was made (a spec of another kind, a tool call's ``run``
  spec, is a data error: `GoldKindError` is raised, never counted); ``pool.last_error`` is the latest unscorable
  item's cause on one line (what the trainer names when it stops a run whose reward scores
  nothing, ``model.max_unscorable_steps``). Each `run` logs its batch's counts and throughput
  at INFO, and unscorable items at WARNING (`SandboxUnavailable` once per pool, later ones at
  DEBUG: it is the same for every program).

What is not covered:
- Priorities or cancellation of submitted work (``close`` waits for what is running).
- Scoring rewards other than code: `ibpo_lit.rewards.RewardPool` runs any reward by name, "code"
  included, in worker processes.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from ibpo_lit.rewards.code import (
    STATUSES,
    CodeResult,
    CodeTests,
    GoldKindError,
    SandboxError,
    run_code_tests,
)
from ibpo_lit.rewards.sandbox.isolation import SandboxUnavailable

logger = logging.getLogger(__name__)

UNSCORABLE = "unscorable"


class SandboxPool:
    """Run code (completion, gold) pairs in sandboxes, ``num_workers`` at a time.

    Args:
        num_workers: Programs run at once (each is two or three processes while it runs).

    Raises:
        ValueError: ``num_workers`` < 1.
    """

    def __init__(self, num_workers: int = 2):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self.stats: Counter[str] = Counter({s: 0 for s in (*STATUSES, UNSCORABLE)})
        self.last_error: str | None = None  # the latest unscorable item's cause, one line
        self._warned_unavailable = False  # SandboxUnavailable logged at WARNING already
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="code-sandbox")

    def submit(self, completion: str, gold: str) -> Future[CodeResult | None]:
        """Schedule one run; the future's value is None when the pair is unscorable."""
        return self._executor.submit(self._one, completion, gold)

    def run(self, pairs: Sequence[tuple[str, str]]) -> list[CodeResult | None]:
        """Run every pair; logs the batch's status counts."""
        start = time.monotonic()
        results = [f.result() for f in [self.submit(c, g) for c, g in pairs]]
        if results:
            counts = Counter(r.status if r is not None else UNSCORABLE for r in results)
            seconds = time.monotonic() - start
            logger.info("code sandbox: %d programs in %.1f s (%.1f/s): %s", len(results), seconds,
                        len(results) / max(seconds, 1e-9), dict(sorted(counts.items())))
        return results

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float | None]:
        """`code_reward` of each pair (1.0/0.0, or the fraction for ``reward="fraction"``)."""
        scores = []
        for (_, gold), result in zip(pairs, self.run(pairs)):
            if result is None:
                scores.append(None)
            elif CodeTests.from_gold(gold).reward == "all":
                scores.append(1.0 if result.passed == result.total else 0.0)
            else:
                scores.append(result.fraction)
        return scores

    @property
    def unscorable(self) -> dict[str, int]:
        """Programs scored None so far, as `RewardPool` counts them: the harness failed (``none``);
        a program's timeout or error is its score (0), not a cause here."""
        return {"timeout": 0, "error": 0, "none": self.stats[UNSCORABLE]}

    def close(self) -> None:
        """Wait for running programs, then stop the threads (idempotent)."""
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _one(self, completion: str, gold: str) -> CodeResult | None:
        cause, unavailable, level = None, False, logging.WARNING
        try:
            result = run_code_tests(completion, CodeTests.from_gold(gold))
        except GoldKindError:  # a data error, not an unscorable program: the caller stops
            raise
        except (ValueError, TypeError, SandboxError, SandboxUnavailable) as e:
            # SandboxUnavailable (no bwrap, no user namespaces) makes every program unscorable:
            # the trainer stops such a run after model.max_unscorable_steps, naming this cause.
            result, cause = None, f"{type(e).__name__}: {_one_line(e)}"
            unavailable = isinstance(e, SandboxUnavailable)
        with self._lock:
            self.stats[result.status if result is not None else UNSCORABLE] += 1
            if cause is not None:
                self.last_error = cause
                if unavailable:
                    level = logging.DEBUG if self._warned_unavailable else logging.WARNING
                    self._warned_unavailable = True
        if cause is not None:
            logger.log(level, "code sandbox: unscorable program: %s", cause)
        return result


def _one_line(e: BaseException, limit: int = 400) -> str:
    """An exception's message on one line, at most ``limit`` characters."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
