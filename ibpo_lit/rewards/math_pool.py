"""`math_score` and `math_scores`: math-verify's score with a hard timeout, for use outside a run.

They go through a module-level `RewardPool("math")` (one worker, ``DEFAULT_TIMEOUT_S`` per item),
created on first use (again in a forked child) and closed at exit. A timed-out item is None
(unscorable). Each call is one round trip to a worker process, so score a batch with
`math_scores` (or a `RewardPool` of your own with several workers) rather than calling
`math_score` in a loop. Training and evaluation do not use it: they score through the math
task's pool (``ibpo_lit.tasks``), with the run's workers and timeout.
"""
from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Sequence

from ibpo_lit.rewards.math import DEFAULT_TIMEOUT_S
from ibpo_lit.rewards.pool import RewardPool

_default_pool: RewardPool | None = None
_default_pool_lock = threading.Lock()


def _pool() -> RewardPool:
    """The module-level math pool: created on first use (and again in a forked child)."""
    global _default_pool
    with _default_pool_lock:
        if _default_pool is None or _default_pool._owner_pid != os.getpid():
            _default_pool = RewardPool("math", num_workers=1, timeout_s=DEFAULT_TIMEOUT_S)
            atexit.register(_default_pool.close)
        return _default_pool


def math_score(completion: str, gold: str) -> float | None:
    """Score a completion against a gold answer: 1.0 correct, 0.0 wrong or no answer.

    The score of `math_score_inprocess`, computed in a worker process that is killed after
    ``DEFAULT_TIMEOUT_S`` seconds. Works from any thread.

    Args:
        completion: the model's response text.
        gold: the gold final answer, plain or LaTeX ("72", "\\frac{1}{2}").

    Returns:
        1.0 or 0.0; None if the pair cannot be scored (gold unparseable, math-verify error,
        timeout).
    """
    return _pool().score([(completion, gold)])[0]


def math_scores(completions: Sequence[str], golds: Sequence[str]) -> list[float | None]:
    """`math_score` over a batch, in one call to the module-level pool.

    Raises:
        ValueError: if the two sequences differ in length.
    """
    if len(completions) != len(golds):
        raise ValueError(f"{len(completions)} completions but {len(golds)} golds")
    return _pool().score(list(zip(completions, golds)))
