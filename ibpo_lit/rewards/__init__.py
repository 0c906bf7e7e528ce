"""Verifiers: strings in, scores out. A reward is found by name with `get_reward`.

``REWARDS`` maps a name to an in-process function ``fn(completion, gold) -> float | None`` with
no time limit (``"math"`` is `math_score_inprocess`). To score with a hard timeout, run a reward
by name in a `RewardPool` (worker processes, killed past the timeout); `math_score` and
`math_scores` do that for "math" through a shared default pool.

Keep this package light (no torch, no Lightning): pool workers import it.
"""
from __future__ import annotations

from ibpo_lit.rewards.math import (
    RewardFn,
    extract_gsm8k_gold,
    math_score,
    math_score_inprocess,
    math_scores,
)
from ibpo_lit.rewards.pool import RewardPool

REWARDS: dict[str, RewardFn] = {
    "math": math_score_inprocess,
}


def get_reward(name: str) -> RewardFn:
    """The in-process verifier registered as ``name``: ``fn(completion, gold) -> float | None``.

    Raises:
        ValueError: if no verifier has that name (the message lists the valid names).
    """
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; valid names: {sorted(REWARDS)}") from None


__all__ = [
    "REWARDS",
    "RewardFn",
    "RewardPool",
    "extract_gsm8k_gold",
    "get_reward",
    "math_score",
    "math_score_inprocess",
    "math_scores",
]
