"""Rewards a model scores in the trainer's process: ``reward_model:<path>`` (a sequence
classifier's logit) and ``judge:<template>`` (an LLM's parsed verdict), docs/reward_models.md.

They sit above ``ibpo_lit.rewards`` (strings in, scores out, no torch) because they load models,
run on the policy's device and, under FSDP2, are sharded and take part in the run's collectives.
They keep the rewards' one calling contract (``fn(prompts, completions, **columns)``) and the
pools' interface (`InTrainerPool`), so `ibpo_lit.rewards.WeightedRewards` sums them with any
other reward.
"""
from ibpo_lit.model_rewards.context import ModelRewardContext
from ibpo_lit.model_rewards.judge import JUDGE_TEMPLATES, Judge, JudgeOptions, JudgeTemplate, check_template
from ibpo_lit.model_rewards.kinds import MODEL_REWARDS, check_model_reward, model_reward_pool
from ibpo_lit.model_rewards.reward_model import RewardModel, RewardModelOptions, check_reward_model
from ibpo_lit.model_rewards.runner import InTrainerPool, ScoringReport
from ibpo_lit.model_rewards.verdicts import JUDGE_PARSERS, VerdictParser, get_parser

__all__ = [
    "JUDGE_PARSERS",
    "JUDGE_TEMPLATES",
    "MODEL_REWARDS",
    "InTrainerPool",
    "Judge",
    "JudgeOptions",
    "JudgeTemplate",
    "ModelRewardContext",
    "RewardModel",
    "RewardModelOptions",
    "ScoringReport",
    "VerdictParser",
    "check_model_reward",
    "check_reward_model",
    "check_template",
    "get_parser",
    "model_reward_pool",
]
