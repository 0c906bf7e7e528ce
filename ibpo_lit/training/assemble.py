"""From scored rollouts to what the update trains on (step 4 of README's diagram).

Shaped rewards (IBPO), advantages, and the correction samples when they are trained
jointly: ``assemble_update`` fills ``step.shaped_rewards``, ``step.delta`` and ``step.update``.

Advantages come from ``algorithm.advantage_scale``: a group-relative estimator
(``ADVANTAGE_SCALES``) gives [N] advantages, the rollouts' groups and the correction samples'
computed apart; a token-level one (``TOKEN_ADVANTAGES``: REINFORCE++) gives [N, Lr] advantages
of the whole update batch at once (rollouts and correction samples whitened together), from the
shaped outcome reward on each row's last token and, with ``beta_kl > 0``, the KL to the
reference in every token's reward: the reference's only forward before the update, through the
``reference_logprobs`` the module hands in, on every rank (a collective under FSDP2). No other
forward happens here (CIW's token weights are the module's next call).
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from typing import Callable, Optional

from ibpo_lit.algorithms.advantages import grouped_advantages
from ibpo_lit.algorithms.overlong import soft_overlong_penalty
from ibpo_lit.algorithms.registry import TOKEN_ADVANTAGES
from ibpo_lit.algorithms.regularizers import token_kl
from ibpo_lit.algorithms.shaping import shape_rewards
from ibpo_lit.config import AlgorithmConfig
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.scale.collectives import SINGLE_PROCESS, RankSync
from ibpo_lit.training.step_types import ScoredRollouts, UpdateBatch


def assemble_update(step: ScoredRollouts, algo: AlgorithmConfig, pad_token_id: int,
                    max_new_tokens: int | None = None,
                    reference_logprobs: Optional[Callable[[RolloutBatch], Tensor]] = None,
                    sync: RankSync = SINGLE_PROCESS) -> dict[str, float]:
    """Shape, compute advantages and build ``step.update``; returns the step's reward metrics.

    ``max_new_tokens``: the rollouts' length limit, which the soft overlong penalty counts from.
    ``reference_logprobs``: the reference's log-probs [N, Lr] of a batch, needed when the KL
    goes into the reward (``algo.kl_in_reward``). ``sync``: the run's collectives (a batch-wide
    statistic, "batch" scales' and REINFORCE++'s, is over every process's rows; every rank calls
    this once a step)."""
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

    token_level = algo.token_level_advantages
    advantages = None if token_level else grouped_advantages(shaped, rollouts.group_index.cpu(),
                                                             scale=algo.advantage_scale, total=sync.sum)
    batch, update_rewards = rollouts, shaped
    extra = corrections.train_batch if corrections is not None else None
    if extra is not None and not len(extra):
        extra = None
    if corrections is not None and not token_level:
        # On every rank, one without correction samples too: a batch-wide scale sums over processes.
        extra_rewards = corrections.train_rewards if extra is not None else torch.zeros(0)
        # Correction groups are numbered after the prompts' so the two never mix.
        extra_groups = (extra.group_index.cpu() + int(rollouts.group_index.max()) + 1 if extra is not None
                        else torch.zeros(0, dtype=torch.long))
        extra_adv = grouped_advantages(extra_rewards, extra_groups, scale=algo.advantage_scale, total=sync.sum)
        advantages = torch.cat([advantages, extra_adv.to(advantages.dtype)])
    if extra is not None:
        batch = RolloutBatch.concat([rollouts, extra], pad_token_id=pad_token_id)
        update_rewards = torch.cat([shaped, corrections.train_rewards.to(shaped.dtype)])
        if token_weights is not None:
            width = batch.response_ids.shape[1]
            token_weights = torch.cat([
                torch.nn.functional.pad(token_weights, (0, width - token_weights.shape[1]), value=1.0),
                torch.ones(len(extra), width),
            ])
        metrics["train/correction_reward"] = nanmean(corrections.train_rewards)
    if token_level:
        advantages, more = token_advantages(batch, update_rewards, algo, reference_logprobs, sync)
        metrics.update(more)
    if overlong.mask_truncated:
        cut = ~batch.finished.cpu()
        advantages = advantages.masked_fill(cut if advantages.dim() == 1 else cut[:, None], 0.0)
        batch = replace(batch, response_mask=batch.response_mask & ~cut[:, None].to(batch.response_mask.device))
        metrics["train/masked_truncated"] = float(cut.sum())
    step.shaped_rewards, step.delta = shaped, delta
    step.update = UpdateBatch(batch=batch, advantages=advantages, token_weights=token_weights)
    return metrics


def token_advantages(batch: RolloutBatch, rewards: Tensor, algo: AlgorithmConfig,
                     reference_logprobs: Optional[Callable[[RolloutBatch], Tensor]],
                     sync: RankSync) -> tuple[Tensor, dict[str, float]]:
    """[N, Lr] advantages of a token-level estimator over ``batch`` (rollouts and correction
    samples together), rewards [N]; with ``beta_kl > 0`` the KL per token (``kl_estimator``,
    k1 unless set) between the engine's sampled log-probs (pi_old, ``softmax(logits / T)``
    before the sampling filters, the distribution the trainer's forward computes) and the
    reference's. Metrics: ``train/kl``, the mean KL per response token (this rank's).

    Tokens are the policy's (``policy_mask``): tool-output turns get no KL reward, no share of
    the statistics, and the outcome sits on the policy's last token."""
    mask = batch.policy_mask.cpu()
    kl, metrics = None, {}
    if algo.kl_in_reward:
        if reference_logprobs is None:
            raise ValueError(f"advantage_scale: {algo.advantage_scale} with beta_kl > 0 needs the reference's "
                             "log-probs before the advantages (reference_logprobs)")
        ref_logp = reference_logprobs(batch).cpu()
        kl = token_kl(batch.rollout_logp.cpu()[:, : ref_logp.shape[1]], ref_logp, mask[:, : ref_logp.shape[1]],
                      algo.reward_kl_estimator)
        kl = torch.nn.functional.pad(kl, (0, mask.shape[1] - kl.shape[1]))
        metrics["train/kl"] = float(kl.sum() / mask.sum().clamp_min(1))
    estimator = TOKEN_ADVANTAGES.get(algo.advantage_scale)
    return estimator(rewards, kl, mask, algo.token_advantage_settings, sync.sum), metrics


def nanmean(values: Tensor) -> float:
    finite = values[~values.isnan()]
    return float(finite.mean()) if finite.numel() else math.nan
