"""The pool that scores a reward, the same one in training and in evaluation.

``code`` runs in a `SandboxPool`: every program is bounded by its own limits (its tests'
``timeout_s`` and ``memory_mb``, the judge's watchdog) and killed with its sandbox, so a worker
process around it would only add a process and a second, competing timeout. Every other reward
runs in a `RewardPool`: worker processes, each item killed past ``timeout_s``.

Both answer ``score(pairs) -> list[float | None]`` (None: unscorable), ``unscorable`` (counts
by cause: ``timeout``, ``error``, ``none``) and ``close()``.
"""
from __future__ import annotations

from typing import Optional, Union

from ibpo_lit.rewards.pool import RewardPool
from ibpo_lit.rewards.sandbox.pool import SandboxPool


def scoring_pool(reward: str, num_workers: int = 1, timeout_s: float = 5.0,
                 import_modules: Optional[list[str]] = None) -> Union[RewardPool, SandboxPool]:
    """A pool for ``reward`` (``timeout_s`` and ``import_modules`` apply to `RewardPool` only)."""
    if reward == "code":
        return SandboxPool(num_workers=num_workers)
    return RewardPool(reward, num_workers=num_workers, timeout_s=timeout_s, import_modules=import_modules)
