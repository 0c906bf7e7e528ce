"""Verifiers: strings in, scores out. A built-in reward is found by name with `get_reward`; any
reward, built-in or ``package.module:function``, is loaded in the batch form every pool calls
(``fn(prompts, completions, **columns) -> list[float | None]``, TRL's convention) with
`load_reward` (`ibpo_lit.rewards.functions`, docs/rewards.md).

``REWARDS`` (a `Registry`, as the losses are) maps a name to an in-process function
``fn(completion, gold) -> float | None`` with no time limit; ``@REWARDS.register("name")`` adds one (``"math"`` is `math_score_inprocess`). To score with a hard timeout, run a reward
by name in a `RewardPool` (worker processes, killed past the timeout); `math_score` and
`math_scores` (`ibpo_lit.rewards.math_pool`) do that for "math" through a shared default pool.

``"code"`` is `code_reward`: the gold is `CodeTests.to_gold()` and the program runs in a sandbox
with its own time limit (`ibpo_lit.rewards.code`); `run_tests` and `code_score` run tests given
directly, and `SandboxPool` runs several programs at once and counts their statuses.
`WeightedRewards` sums several (``model.rewards``); the pool each reward is scored in is its
task's (``ibpo_lit.tasks.scoring_pool``, the same in training and in evaluation). Rewards a model
scores in the trainer (``reward_model:...``, ``judge:...``, `model_scored_kind`) are only named
here; ``ibpo_lit.model_rewards`` builds them.

Keep this package light (no torch, no Lightning): pool workers import it.
"""
from __future__ import annotations

from ibpo_lit.rewards.builtin import REWARDS, get_reward
from ibpo_lit.rewards.code import (
    CodeResult,
    CodeTests,
    SandboxError,
    code_reward,
    code_score,
    extract_code,
    run_code_tests,
    run_tests,
)
from ibpo_lit.rewards.functions import (
    RewardImportError,
    RewardOutputError,
    RewardSpec,
    load_reward,
    model_scored_kind,
    resolve_specs,
)
from ibpo_lit.rewards.math import (
    RewardFn,
    extract_gsm8k_gold,
    math_score_inprocess,
)
from ibpo_lit.rewards.math_pool import math_score, math_scores
from ibpo_lit.rewards.pool import RewardPool
from ibpo_lit.rewards.sandbox.isolation import SandboxUnavailable
from ibpo_lit.rewards.sandbox.pool import SandboxPool
from ibpo_lit.rewards.scoring import WeightedRewards

__all__ = [
    "REWARDS",
    "CodeResult",
    "CodeTests",
    "RewardFn",
    "RewardImportError",
    "RewardOutputError",
    "RewardPool",
    "RewardSpec",
    "SandboxError",
    "SandboxPool",
    "SandboxUnavailable",
    "WeightedRewards",
    "code_reward",
    "code_score",
    "extract_code",
    "extract_gsm8k_gold",
    "get_reward",
    "load_reward",
    "math_score",
    "math_score_inprocess",
    "math_scores",
    "model_scored_kind",
    "resolve_specs",
    "run_code_tests",
    "run_tests",
]
