"""From scored rollouts to what the update trains on (step 4 of README's diagram).

Shaped rewards (IBPO), group advantages, and the correction samples when they are trained
jointly: ``assemble_update`` fills ``step.shaped_rewards``, ``step.delta`` and ``step.update``.
No forward pass happens here (CIW's token weights are the module's next call).
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from ibpo_lit.algorithms.advantages import grouped_advantages
from ibpo_lit.algorithms.overlong import soft_overlong_penalty
from ibpo_lit.algorithms.shaping import shape_rewards
from ibpo_lit.config import AlgorithmConfig
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.step_types import ScoredRollouts, UpdateBatch


def assemble_update(step: ScoredRollouts, algo: AlgorithmConfig, pad_token_id: int,
                    max_new_tokens: int | None = None) -> dict[str, float]:
    """Shape, compute advantages and build ``step.update``; returns the step's reward metrics.

    ``max_new_tokens``: the rollouts' length limit, which the soft overlong penalty counts from."""
    rollouts, rewards, corrections = step.rollouts, step.rewards, step.corrections
    metrics: dict[str, float] = {"train/reward": nanmean(rewards), "train/unscorable": float(rewards.isnan().sum())}

    shaped, token_weights, delta = rewards, None, torch.zeros_like(rewards)
    ibpo = algo.ibpo
    if ibpo.enabled and corrections is not None:
        result = shape_rewards(
            rewards, corrections.rewards, corrections.rewrite, corrections.kept_mask.cpu(),
            rollouts.policy_mask.cpu(), variant=ibpo.variant, lam=ibpo.lam, beta=ibpo.beta,  # (tool turns: not the policy's)
        )
        shaped, token_weights, delta = result.shaped_rewards, result.token_weights, result.delta
        metrics["train/shaped_frac"] = float((result.delta > 0).float().mean())
    overlong = algo.overlong
    if overlong.soft_buffer is not None:
        if max_new_tokens is None:
            raise ValueError("algorithm.overlong.soft_buffer needs the rollouts' max_new_tokens")
        # After IBPO's shaping, which reads the verifier's 0/1 to pair wrong rollouts with right ones.
        penalty = soft_overlong_penalty(rollouts.response_lengths.cpu(), max_new_tokens, overlong.soft_buffer,
                                        overlong.soft_factor)
        shaped = shaped + penalty
        metrics["train/overlong_penalty"] = float(penalty.mean())
    metrics["train/shaped_reward"] = nanmean(shaped)
    if corrections is not None:
        metrics.update(corrections.metrics)

    advantages = grouped_advantages(shaped, rollouts.group_index.cpu(), scale=algo.advantage_scale)
    batch = rollouts
    if corrections is not None and corrections.train_batch is not None and len(corrections.train_batch):
        extra = corrections.train_batch
        # Correction groups are numbered after the prompts' so the two never mix.
        extra_groups = extra.group_index + int(rollouts.group_index.max()) + 1
        extra_adv = grouped_advantages(corrections.train_rewards, extra_groups.cpu(), scale=algo.advantage_scale)
        batch = RolloutBatch.concat([rollouts, extra], pad_token_id=pad_token_id)
        advantages = torch.cat([advantages, extra_adv])
        if token_weights is not None:
            width = batch.response_ids.shape[1]
            token_weights = torch.cat([
                torch.nn.functional.pad(token_weights, (0, width - token_weights.shape[1]), value=1.0),
                torch.ones(len(extra), width),
            ])
        metrics["train/correction_reward"] = nanmean(corrections.train_rewards)
    if overlong.mask_truncated:
        cut = ~batch.finished.cpu()
        advantages = advantages.masked_fill(cut, 0.0)
        batch = replace(batch, response_mask=batch.response_mask & ~cut[:, None].to(batch.response_mask.device))
        metrics["train/masked_truncated"] = float(cut.sum())
    step.shaped_rewards, step.delta = shaped, delta
    step.update = UpdateBatch(batch=batch, advantages=advantages, token_weights=token_weights)
    return metrics


def nanmean(values: Tensor) -> float:
    finite = values[~values.isnan()]
    return float(finite.mean()) if finite.numel() else math.nan
