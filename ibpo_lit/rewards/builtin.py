"""``REWARDS``: the built-in verifiers by name, each ``fn(completion, gold) -> float | None``,
in-process and with no time limit (the pools add one). ``@REWARDS.register("name")`` adds one.

Its own module, below the pools and the batch form (`ibpo_lit.rewards.functions` looks names
up here), so that nothing in the package imports its ``__init__``.
"""
from __future__ import annotations

from ibpo_lit.registry import Registry
from ibpo_lit.rewards.code import code_reward
from ibpo_lit.rewards.math import RewardFn, math_score_inprocess

REWARDS = Registry("reward")
REWARDS.register("math")(math_score_inprocess)
REWARDS.register("code")(code_reward)


def get_reward(name: str) -> RewardFn:
    """The in-process verifier registered as ``name``: ``fn(completion, gold) -> float | None``.

    Raises:
        ValueError: if no verifier has that name (the message lists the valid names).
    """
    return REWARDS.get(name)
