"""``REWARDS``: the built-in verifiers by name, each ``fn(completion, gold) -> float | None``,
in-process and with no time limit (the pools add one). ``@REWARDS.register("name")`` adds one.
A verifier may declare the kinds of gold it scores (``fn.gold_kinds``, `ibpo_lit.rewards.gold_kinds`):
`check_gold` refuses any other kind, for the pools and the data.

Its own module, below the pools and the batch form (`ibpo_lit.rewards.functions` looks names
up here), so that nothing in the package imports its ``__init__``.
"""
from __future__ import annotations

from typing import Optional

from ibpo_lit.registry import Registry
from ibpo_lit.rewards.code import code_reward
from ibpo_lit.rewards.gold_kinds import check_kind
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


def check_gold(reward: Optional[str], gold: Optional[str], where: str = "") -> None:
    """Refuse a gold of a kind the built-in ``reward`` is not for (its ``gold_kinds``).

    A reward that declares no kinds (an import path, a model, a verifier registered without
    ``gold_kinds``), no reward (None) and no gold (None) pass. ``where`` (a record's uid) starts
    the message.

    Raises:
        GoldKindError: the kind found, the reward, the kinds it scores and what to do instead.
    """
    if reward is None or gold is None or reward not in REWARDS:
        return
    accepted = getattr(REWARDS[reward], "gold_kinds", None)
    if accepted is not None:
        check_kind(reward, gold, accepted, where)
