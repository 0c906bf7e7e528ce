"""Group-relative advantages (METHOD section 2): ``A_i = (r_i - mean_g) / denominator``.

Covered:
- scale "group" (GRPO/GSPO): population std (divide by n) of the prompt's group;
- scale "batch": population std of all finite rewards of the batch, the mean still per group;
- scale "none" (Dr.GRPO): ``A_i = r_i - mean_g``, no division;
- scale "rloo" (RLOO, verl's and TRL's ``rloo``): the leave-one-out baseline,
  ``A_i = r_i - mean_{j != i} r_j``, which is ``(r_i - mean_g) * n / (n - 1)`` (n the group's
  finite rewards): the denominator ``(n - 1) / n``;
- scale "reinforce_plus_plus_baseline" (REINFORCE++-baseline, verl's and OpenRLHF's name):
  ``A_i = (r_i - mean_g) / std_batch(r - mean_g)``, the group-centred rewards divided by their
  population std over the whole batch. Per response: OpenRLHF whitens over tokens, where a long
  response weighs more; REINFORCE++ with the KL in the reward (token-level returns) is not here;
- ragged groups (``grouped_advantages``), e.g. corrections grouped by their original prompt.

Choices the papers leave open:
- NaN reward = "unscorable" (STYLE section 8): excluded from every mean and std, advantage 0.
- A group with fewer than 2 finite rewards, or whose finite rewards are all equal, gives 0 to
  all its members (no signal), whatever the scale; the test is ``max == min`` rather than
  ``std == 0`` so float rounding of the mean cannot leak a tiny non-zero advantage.
- "batch" with fewer than 2 finite rewards in the whole batch: std is 0, so only the 1e-8
  remains; every group is degenerate then anyway, so all advantages are 0.
- "batch" and "reinforce_plus_plus_baseline": the batch is this process's rollouts (each rank
  computes its own advantages), so with several processes the std is each rank's.
- Computed in float32 at least (float64 inputs stay float64).

Not covered: DAPO dynamic sampling (dropping degenerate groups) belongs to the rollout stage.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ibpo_lit.algorithms.registry import ADVANTAGE_SCALES

STD_EPS = 1e-8


@ADVANTAGE_SCALES.register("group")
def _group_scale(
    rewards: Tensor, finite: Tensor, group_index: Tensor, group_mean: Tensor, group_count: Tensor
) -> Tensor:
    """[B] population std of each row's group (+eps); rewards are 0 where not finite."""
    centered = torch.where(finite, rewards - group_mean[group_index], 0.0)
    sq = torch.zeros_like(group_mean).index_add_(0, group_index, centered * centered)
    std = (sq / group_count.clamp_min(1)).sqrt()
    return std[group_index] + STD_EPS


@ADVANTAGE_SCALES.register("batch")
def _batch_scale(
    rewards: Tensor, finite: Tensor, group_index: Tensor, group_mean: Tensor, group_count: Tensor
) -> Tensor:
    """[B] population std of all finite rewards of the batch (+eps), the same for every row."""
    n = finite.sum().clamp_min(1)
    mean = rewards.sum() / n  # non-finite rewards are already 0
    var = (torch.where(finite, rewards - mean, 0.0) ** 2).sum() / n
    return (var.sqrt() + STD_EPS).expand_as(rewards)


@ADVANTAGE_SCALES.register("rloo")
def _leave_one_out(
    rewards: Tensor, finite: Tensor, group_index: Tensor, group_mean: Tensor, group_count: Tensor
) -> Tensor:
    """[B] ``(n - 1) / n`` of each row's group: ``(r_i - mean) * n / (n - 1)`` is ``r_i`` minus
    the mean of the group's other rewards (a group with fewer than 2 is degenerate: 0 anyway)."""
    n = group_count.clamp_min(2)
    return ((n - 1) / n)[group_index]


@ADVANTAGE_SCALES.register("reinforce_plus_plus_baseline")
def _centred_batch_scale(
    rewards: Tensor, finite: Tensor, group_index: Tensor, group_mean: Tensor, group_count: Tensor
) -> Tensor:
    """[B] population std of the group-centred rewards over the batch's finite rows (+eps); their
    mean is 0 (each group's centred rewards sum to 0), so none is subtracted."""
    centred = torch.where(finite, rewards - group_mean[group_index], 0.0)
    var = (centred * centred).sum() / finite.sum().clamp_min(1)
    return (var.sqrt() + STD_EPS).expand_as(rewards)


@ADVANTAGE_SCALES.register("none")
def _no_scale(
    rewards: Tensor, finite: Tensor, group_index: Tensor, group_mean: Tensor, group_count: Tensor
) -> Tensor:
    """[B] ones: Dr.GRPO keeps the centred reward."""
    return torch.ones_like(rewards)


def grouped_advantages(rewards: Tensor, group_index: Tensor, scale: str = "group") -> Tensor:
    """Advantages of responses in ragged groups.

    Args:
        rewards: [B] float; NaN (or inf) marks an unscorable response.
        group_index: [B] long, any non-negative ids; rows with the same id form one group,
            groups may have different sizes.
        scale: a name in ``ADVANTAGE_SCALES`` ("group", "batch", "none", "rloo",
            "reinforce_plus_plus_baseline").

    Returns:
        [B] advantages, 0 for unscorable rows and for rows of degenerate groups.
    """
    scale_fn = ADVANTAGE_SCALES.get(scale)
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both be [B]; got {tuple(rewards.shape)} "
            f"and {tuple(group_index.shape)}"
        )
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    rewards = rewards.to(dtype)
    if rewards.numel() == 0:
        return rewards.clone()
    # Compact arbitrary ids to 0..G-1 so the per-group buffers have G entries.
    _, gid = torch.unique(group_index, return_inverse=True)
    num_groups = int(gid.max()) + 1

    finite = torch.isfinite(rewards)
    r = torch.where(finite, rewards, 0.0)
    count = torch.zeros(num_groups, dtype=dtype, device=r.device).index_add_(
        0, gid, finite.to(dtype)
    )
    total = torch.zeros_like(count).index_add_(0, gid, r)
    mean = total / count.clamp_min(1)

    # Degenerate groups: max == min over the finite rewards, or fewer than 2 of them.
    inf = torch.tensor(float("inf"), dtype=dtype, device=r.device)
    gmax = torch.full_like(count, -inf).scatter_reduce(
        0, gid, torch.where(finite, r, -inf), reduce="amax"
    )
    gmin = torch.full_like(count, inf).scatter_reduce(
        0, gid, torch.where(finite, r, inf), reduce="amin"
    )
    informative = (count >= 2) & (gmax > gmin)

    denom = scale_fn(r, finite, gid, mean, count)
    adv = (r - mean[gid]) / denom
    return torch.where(finite & informative[gid], adv, 0.0)


def group_advantages(rewards: Tensor, scale: str = "group") -> Tensor:
    """Advantages of a dense batch of groups.

    Args:
        rewards: [P, G] float, row p holds the G rewards of prompt p; NaN = unscorable.
        scale: a name in ``ADVANTAGE_SCALES``.

    Returns:
        [P, G] advantages (see ``grouped_advantages``, which this delegates to).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, G]; got {tuple(rewards.shape)}")
    p, g = rewards.shape
    group_index = torch.arange(p, device=rewards.device).repeat_interleave(g)
    return grouped_advantages(rewards.reshape(-1), group_index, scale).reshape(p, g)
