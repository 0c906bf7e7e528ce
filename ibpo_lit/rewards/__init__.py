"""Verifiers: strings in, scores out. A reward is found by name with `get_reward`."""
from __future__ import annotations

from ibpo_lit.rewards.math import RewardFn, extract_gsm8k_gold, math_score

REWARDS: dict[str, RewardFn] = {
    "math": math_score,
}


def get_reward(name: str) -> RewardFn:
    """The verifier registered as ``name``: ``fn(completion, gold) -> float | None``.

    Raises:
        ValueError: if no verifier has that name (the message lists the valid names).
    """
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; valid names: {sorted(REWARDS)}") from None


__all__ = ["REWARDS", "RewardFn", "extract_gsm8k_gold", "get_reward", "math_score"]
