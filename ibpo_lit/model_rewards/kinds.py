"""`MODEL_REWARDS`: the kinds of reward a model scores in the trainer, by their spec's prefix.

One contract per kind, as for every registry: ``options_type(**spec.options)`` validates the
options, ``check(target, options)`` checks the spec without loading weights (configuration
time), and ``build(target, ctx, options)`` returns the reward, a callable with the batch
contract of every reward (``fn(prompts, completions, **columns) -> list[float | None]``).

`check_model_reward(spec)` and `model_reward_pool(spec, ctx)` are what the module calls: the
first when it reads its settings, the second when it builds its rewards' pools.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from ibpo_lit.errors import ConfigError
from ibpo_lit.model_rewards.context import ModelRewardContext
from ibpo_lit.model_rewards.judge import Judge, JudgeOptions, check_judge
from ibpo_lit.model_rewards.reward_model import RewardModel, RewardModelOptions, check_reward_model
from ibpo_lit.model_rewards.runner import InTrainerPool
from ibpo_lit.registry import Registry
from ibpo_lit.rewards.functions import RewardSpec, model_scored_kind, model_target


@dataclass(frozen=True)
class ModelRewardKind:
    """How one kind of model-scored reward is checked and built (see the module docstring)."""

    options_type: type
    check: Callable[[str, Any], Any]
    build: Callable[[str, ModelRewardContext, Any], Callable]


MODEL_REWARDS = Registry("model-scored reward")
MODEL_REWARDS.register("reward_model")(ModelRewardKind(
    RewardModelOptions, lambda target, options: check_reward_model(target), RewardModel))
MODEL_REWARDS.register("judge")(ModelRewardKind(JudgeOptions, check_judge, Judge))


def _kind_and_options(spec: RewardSpec) -> tuple[ModelRewardKind, Any]:
    kind_name = model_scored_kind(spec.name)
    if kind_name is None:
        raise ValueError(f"reward {spec.name!r} is not scored by a model (reward_model:... or judge:...)")
    kind = MODEL_REWARDS[kind_name]
    given = dict(spec.options or {})
    valid = [f.name for f in fields(kind.options_type)]
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ConfigError(f"model.rewards: {spec.name!r} has no option {unknown[0]!r}; its options: {', '.join(valid)}")
    try:
        return kind, kind.options_type(**given)
    except ConfigError as e:
        raise ConfigError(f"model.rewards: {spec.name!r}: {e}") from None


def check_model_reward(spec: RewardSpec) -> None:
    """Check a ``reward_model:`` or ``judge:`` spec without loading weights (a ConfigError naming
    the reward and what is wrong)."""
    kind, options = _kind_and_options(spec)
    kind.check(model_target(spec.name), options)


def model_reward_pool(spec: RewardSpec, ctx: ModelRewardContext) -> InTrainerPool:
    """The reward built (its model loaded: a collective under FSDP2) behind the pools' interface."""
    kind, options = _kind_and_options(spec)
    return InTrainerPool(spec.name, kind.build(model_target(spec.name), ctx, options))
