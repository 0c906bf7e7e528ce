"""Reward functions: one calling contract (TRL's batch form), import paths, weighted rewards.

Every reward the pools run is called the same way, TRL's convention:

    fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]

- ``prompts``: each response's problem text (`Prompt.problem`, the record's question: what a TRL
  dataset's ``prompt`` column holds in its standard, non-conversational format), not the
  chat-templated string the model saw.
- ``completions``: the decoded responses (special tokens removed), one per prompt.
- ``columns``: the record's other fields (`Prompt.columns`), each a list over the batch (None
  where a record lacks a key), plus ``gold`` (`Prompt.gold`: the answer the built-in verifiers
  score against; it replaces a record column of that name) and ``answer`` (the record's
  ``answer``, or ``gold`` when the record has no such column: arithmetic prompts, old data).
  ``prompts`` and ``completions`` are never columns. Write ``**kwargs`` to take the rest.
- The result: one value per completion; None (or NaN) = unscorable.

Why the batch form is the one contract: a reward model or an LLM judge must see many
completions at once to be worth running, and TRL users already write functions this way. The
built-in verifiers (``REWARDS``: ``fn(completion, gold) -> float | None``) are adapted to it
(`per_item`), and the pool sends them one response per call, so a hang in math-verify still
costs exactly one response (see `ibpo_lit.rewards.pool`).

A reward is named by a *spec*: a built-in name (``math``, ``code``, or one registered with
``@REWARDS.register``) or an import path ``package.module:function`` (``:obj.attr`` also works,
for a callable object). `load_reward(spec)` turns either into the batch function.

A third kind is scored by a model in the trainer's own process, on its device (under FSDP2 on
every rank, sharded), rather than in worker processes: ``reward_model:<path or hub id>`` (a
sequence classifier) and ``judge:<template>`` (an LLM asked with a template, its reply parsed).
Their names are known here (`model_scored_kind`) so that specs, labels and the data's task treat
them like any reward; they are built by ``ibpo_lit.model_rewards`` (which loads models, so it
lives above this light package) and called with the same batch contract
(docs/reward_models.md). A spec may carry ``options`` for these kinds only.

What is not covered: conversational prompts (lists of messages) and completions, TRL's extra
keyword arguments (``completion_ids``, ``trainer_state``), async reward functions.
"""
from __future__ import annotations

import importlib
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ibpo_lit.rewards.builtin import get_reward

BatchRewardFn = Callable[..., Sequence[Any]]

RESERVED_COLUMNS = ("prompts", "completions")


@dataclass(frozen=True)
class RewardSpec:
    """One of several weighted rewards (``model.rewards``).

    Args:
        name: A built-in reward (``math``, ``code``, or a name registered in
            ``ibpo_lit.rewards.REWARDS``), an import path ``package.module:function`` called
            as ``fn(prompts, completions, **columns) -> list[float | None]`` (docs/rewards.md),
            or a model scoring in the trainer: ``reward_model:<path or hub id>`` or
            ``judge:<template name or file>`` (docs/reward_models.md).
        weight: Its weight in the summed reward. 0 logs it (``reward/<name>``) without training
            on it.
        options: Settings of a ``reward_model:`` or ``judge:`` reward (docs/reward_models.md);
            no other reward takes any.
    """

    name: str
    weight: float = 1.0
    options: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"model.rewards: a reward's name must be a non-empty string, got {self.name!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, numbers.Real) \
                or not math.isfinite(self.weight):
            raise ValueError(f"model.rewards: the weight of {self.name!r} must be a finite number, got {self.weight!r}")
        kind = model_scored_kind(self.name)
        if kind is not None and not model_target(self.name):
            raise ValueError(f"model.rewards: {self.name!r} names no {'model' if kind == 'reward_model' else 'template'} "
                             f"after '{kind}:' (e.g. '{MODEL_SCORED_EXAMPLES[kind]}')")
        if self.options is not None:
            if kind is None:
                raise ValueError(f"model.rewards: {self.name!r} takes no options (only reward_model:... and judge:... "
                                 "rewards do, docs/reward_models.md)")
            if not isinstance(self.options, dict):
                raise ValueError(f"model.rewards: the options of {self.name!r} must be a mapping, got {self.options!r}")


class RewardImportError(ValueError):
    """An import-path reward that cannot be loaded (module, attribute, not callable)."""


class RewardOutputError(ValueError):
    """A reward function returned something other than one value per completion."""


MODEL_SCORED_KINDS = ("reward_model", "judge")
"""Prefixes of the rewards a model scores in the trainer (``ibpo_lit.model_rewards``)."""
MODEL_SCORED_EXAMPLES = {"reward_model": "reward_model:Skywork/Skywork-Reward-V2-Qwen3-0.6B",
                         "judge": "judge:correctness"}


def model_scored_kind(spec: str) -> Optional[str]:
    """``reward_model`` or ``judge`` for a spec a model scores in the trainer
    (``reward_model:<path>``, ``judge:<template>``); None for any other reward."""
    if not isinstance(spec, str):
        return None
    prefix, sep, _ = spec.partition(":")
    return prefix if sep and prefix in MODEL_SCORED_KINDS else None


def model_target(spec: str) -> str:
    """What follows a model-scored reward's prefix: the model's path or hub id, the template."""
    return spec.partition(":")[2].strip()


def is_import_path(spec: str) -> bool:
    """``package.module:function`` rather than a built-in name (or a model-scored reward)."""
    return ":" in spec and model_scored_kind(spec) is None


def reward_label(spec: str) -> str:
    """The name a reward is logged under (``reward/<label>``): the function's name for an
    import path (``pkg.mod:length_penalty`` -> ``length_penalty``); a reward model's folder or
    hub name (``reward_model:/models/my-rm/`` -> ``my-rm``); ``judge_`` and the template's name
    or file stem for a judge (``judge:correctness`` -> ``judge_correctness``); the name otherwise."""
    kind = model_scored_kind(spec)
    if kind is not None:
        last = model_target(spec).rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
        return last if kind == "reward_model" else "judge_" + last.rsplit(".", 1)[0]
    return spec.rsplit(":", 1)[1].rsplit(".", 1)[-1] if is_import_path(spec) else spec


def import_reward(path: str) -> BatchRewardFn:
    """The callable at ``package.module:attr`` (``attr`` may be dotted).

    Raises:
        RewardImportError: a malformed path, a module that cannot be imported (with the cause),
            a missing attribute, or an attribute that is not callable.
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr or ":" in attr:
        raise RewardImportError(f"reward {path!r}: an import path is 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # ModuleNotFoundError, or the module itself raised while importing
        raise RewardImportError(
            f"reward {path!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}); "
            "is its folder on PYTHONPATH (or the package installed)?"
        ) from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardImportError(f"reward {path!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardImportError(
            f"reward {path!r}: {attr!r} is a {type(obj).__name__}, not a function "
            "fn(prompts, completions, **columns) -> list[float | None]"
        )
    return obj


class per_item:  # noqa: N801 - used as a function
    """A built-in ``fn(completion, gold) -> float | None`` in the batch form."""

    def __init__(self, fn: Callable[[str, str], Optional[float]]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "reward")

    def __call__(self, prompts: list[str], completions: list[str], gold: list[str], **_: Any) -> list:
        return [self.fn(completion, g) for completion, g in zip(completions, gold)]


def load_reward(spec: str) -> BatchRewardFn:
    """The batch function of ``spec``: a built-in adapted with `per_item`, or the imported one.

    Raises:
        ValueError: an unknown built-in name (listing the valid ones), or `RewardImportError`.
    """
    if not isinstance(spec, str):
        raise ValueError(f"a reward is a name or 'package.module:function', got {spec!r}")
    if model_scored_kind(spec) is not None:
        raise ValueError(f"reward {spec!r} is scored by a model in the trainer (ibpo_lit.model_rewards), "
                         "not by a function in a worker process")
    if is_import_path(spec):
        return import_reward(spec)
    return per_item(get_reward(spec))


# ---------------------------------------------------------------- the batch's arguments and results
def reward_columns(columns: dict, gold: str) -> dict:
    """One response's keyword arguments: the record's other fields, ``gold``, and ``answer``
    (the record's, else ``gold``)."""
    out = {k: v for k, v in columns.items() if k not in RESERVED_COLUMNS}
    out["gold"] = gold
    out.setdefault("answer", gold)
    return out


def stack_columns(rows: Sequence[dict]) -> dict[str, list]:
    """Per-response keyword arguments -> one list per key (TRL style), None where a row lacks it."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return {k: [row.get(k) for row in rows] for k in keys}


def check_values(values: Any, n: int) -> tuple[list[Optional[float]], dict[int, str]]:
    """A reward function's result for ``n`` completions -> (values, per-item errors).

    A value is a finite real number (bool, int, float, a NumPy scalar or anything with
    ``__float__`` but a string), None or NaN (unscorable). Anything else is an error of that item
    (its value None, the message in the dict).

    Raises:
        RewardOutputError: not a sequence, or not exactly ``n`` values.
    """
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__") or not hasattr(values, "__iter__"):
        raise RewardOutputError(f"returned a {type(values).__name__}, not a list of {n} numbers")
    values = list(values)
    if len(values) != n:
        raise RewardOutputError(f"returned {len(values)} values for {n} completions")
    out: list[Optional[float]] = []
    errors: dict[int, str] = {}
    for i, v in enumerate(values):
        try:
            if v is None or isinstance(v, (str, bytes)):
                raise TypeError
            x = float(v)
        except (TypeError, ValueError):
            out.append(None)
            if v is not None:
                errors[i] = f"returned {v!r} ({type(v).__name__}), not a number"
            continue
        if math.isinf(x):
            out.append(None)
            errors[i] = f"returned {x}, not a finite number"
            continue
        out.append(None if math.isnan(x) else x)
    return out, errors


# ---------------------------------------------------------------- several rewards, weighted
def resolve_specs(reward: Optional[str], rewards: Optional[Sequence[RewardSpec]]) -> list[RewardSpec]:
    """``model.reward`` (one reward, weight 1) or ``model.rewards`` (several), never both;
    ``math`` when neither is set. Every reward is loaded here once, so a typo, a module that
    does not import or a missing function fails at configuration time. A model-scored reward
    (``reward_model:``, ``judge:``) is only named here: ``ibpo_lit.model_rewards.check_model_reward``
    checks it, without loading weights.

    Raises:
        ValueError: both set, an empty list, two rewards logged under one name, or a reward that
            does not load (the message names it).
    """
    if reward is not None and rewards is not None:
        raise ValueError(
            f"set model.reward (one reward) or model.rewards (several, weighted), not both "
            f"(got model.reward={reward!r} and model.rewards)"
        )
    if rewards is None:
        specs = [RewardSpec(reward if reward is not None else "math")]
    else:
        specs = [r if isinstance(r, RewardSpec) else RewardSpec(**dict(r)) for r in rewards]
        if not specs:
            raise ValueError("model.rewards is empty: list at least one {name, weight}, or set model.reward")
    labels = [reward_label(s.name) for s in specs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"model.rewards: two rewards would be logged as reward/{repeated[0]}; each needs its own name")
    for spec in specs:
        if model_scored_kind(spec.name) is None:
            load_reward(spec.name)
    return specs


def combine(parts: Sequence[Sequence[Optional[float]]], weights: Sequence[float]) -> list[Optional[float]]:
    """The weighted sum of each response's rewards; None (unscorable) when any reward with a
    non-zero weight is None (a sum that silently dropped a term would not be comparable across
    responses). A reward of weight 0 never makes a response unscorable.

    With one reward of weight 1 the values are unchanged (``1.0 * v == v``).
    """
    n = len(parts[0]) if parts else 0
    out: list[Optional[float]] = []
    for i in range(n):
        total: Optional[float] = 0.0
        for values, w in zip(parts, weights):
            if w == 0:
                continue
            if values[i] is None:
                total = None
                break
            total += w * values[i]
        out.append(total)
    return out
