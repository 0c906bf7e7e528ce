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
  response weighs more;
- token level (``TOKEN_ADVANTAGES``), "reinforce_plus_plus" (REINFORCE++, Hu 2025; verl's
  ``adv_estimator: reinforce_plus_plus``, OpenRLHF's ``advantage_estimator: reinforce``): the KL
  to the reference in the reward of every token, the outcome reward on the last, token returns,
  whitened over every valid token of the batch (``reinforce_plus_plus_advantages``, below);
- ragged groups (``grouped_advantages``), e.g. corrections grouped by their original prompt.

Choices the papers leave open:
- NaN reward = "unscorable" (STYLE section 8): excluded from every mean and std, advantage 0.
- A group with fewer than 2 finite rewards, or whose finite rewards are all equal, gives 0 to
  all its members (no signal), whatever the scale; the test is ``max == min`` rather than
  ``std == 0`` so float rounding of the mean cannot leak a tiny non-zero advantage.
- "batch" with fewer than 2 finite rewards in the whole batch: std is 0, so only the 1e-8
  remains; every group is degenerate then anyway, so all advantages are 0.
- "batch", "reinforce_plus_plus_baseline" and "reinforce_plus_plus": the batch is every
  process's rows, as verl and OpenRLHF compute these statistics on the whole batch. The
  caller's ``total`` sums the count and the sums over processes (identity in one process), so
  two ranks holding half the rows each give the advantages one process gives the whole batch.
  Every rank must then call with the same scale, a rank with no rows too (it adds zeros).
- Computed in float32 at least (float64 inputs stay float64).

Not covered: a critic (GAE); REINFORCE++'s token returns are whitened, never baselined by a
value model. DAPO dynamic sampling (dropping degenerate groups) belongs to the rollout stage.
"""
from __future__ import annotations

import torch
from torch import Tensor

from typing import Callable, Optional, Sequence

from ibpo_lit.algorithms.registry import ADVANTAGE_SCALES, TOKEN_ADVANTAGES, TokenAdvantageSettings

STD_EPS = 1e-8
Total = Callable[[Sequence[float]], list[float]]
"""Sums a list of floats over every process of the run (``RankSync.sum``); identity in one."""


def _one_process(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values]


@ADVANTAGE_SCALES.register("group")
def _group_scale(
    rewards: Tensor, finite: Tensor, group_index: Tensor, group_mean: Tensor, group_count: Tensor,
    total: Total = _one_process,
) -> Tensor:
    """[B] population std of each row's group (+eps); rewards are 0 where not finite."""
    centered = torch.where(finite, rewards - group_mean[group_index], 0.0)
    sq = torch.zeros_like(group_mean).index_add_(0, group_index, centered * centered)
    std = (sq / group_count.clamp_min(1)).sqrt()
    return std[group_index] + STD_EPS


@ADVANTAGE_SCALES.register("batch")
def _batch_scale(
    rewards: Tensor, finite: Tensor, group_index: Tensor, group_mean: Tensor, group_count: Tensor,
    total: Total = _one_process,
) -> Tensor:
    """[B] population std of all finite rewards of the batch, every process's (+eps), the same
    for every row. Two passes (count and sum, then squared deviations from the mean), as
    ``whiten``: stabler than a sum of squares."""
    n, s1 = total([float(finite.sum()), float(rewards.sum())])  # non-finite rewards are already 0
    mean = s1 / max(n, 1.0)
    (sq,) = total([float((torch.where(finite, rewards - mean, 0.0) ** 2).sum())])
    std = (sq / max(n, 1.0)) ** 0.5
    return torch.full_like(rewards, std + STD_EPS)


@ADVANTAGE_SCALES.register("rloo")
def _leave_one_out(
    rewards: Tensor, finite: Tensor, group_index: Tensor, group_mean: Tensor, group_count: Tensor,
    total: Total = _one_process,
) -> Tensor:
    """[B] ``(n - 1) / n`` of each row's group: ``(r_i - mean) * n / (n - 1)`` is ``r_i`` minus
    the mean of the group's other rewards (a group with fewer than 2 is degenerate: 0 anyway)."""
    n = group_count.clamp_min(2)
    return ((n - 1) / n)[group_index]


@ADVANTAGE_SCALES.register("reinforce_plus_plus_baseline")
def _centred_batch_scale(
    rewards: Tensor, finite: Tensor, group_index: Tensor, group_mean: Tensor, group_count: Tensor,
    total: Total = _one_process,
) -> Tensor:
    """[B] population std of the group-centred rewards over the batch's finite rows, every
    process's (+eps); their mean is 0 (each group's centred rewards sum to 0, and a group lives
    on one rank), so none is subtracted."""
    centred = torch.where(finite, rewards - group_mean[group_index], 0.0)
    n, sq = total([float(finite.sum()), float((centred * centred).sum())])
    std = (sq / max(n, 1.0)) ** 0.5
    return torch.full_like(rewards, std + STD_EPS)


@ADVANTAGE_SCALES.register("none")
def _no_scale(
    rewards: Tensor, finite: Tensor, group_index: Tensor, group_mean: Tensor, group_count: Tensor,
    total: Total = _one_process,
) -> Tensor:
    """[B] ones: Dr.GRPO keeps the centred reward."""
    return torch.ones_like(rewards)


def grouped_advantages(rewards: Tensor, group_index: Tensor, scale: str = "group",
                       total: Optional[Total] = None) -> Tensor:
    """Advantages of responses in ragged groups.

    Args:
        rewards: [B] float; NaN (or inf) marks an unscorable response. B may be 0 (a rank with
            no rows still takes part in a batch scale's sums).
        group_index: [B] long, any non-negative ids; rows with the same id form one group,
            groups may have different sizes. A group lives on one process.
        scale: a name in ``ADVANTAGE_SCALES`` ("group", "batch", "none", "rloo",
            "reinforce_plus_plus_baseline").
        total: sums a list of floats over every process (``RankSync.sum``), for the scales
            whose statistics are the whole batch's; None: this process alone.

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
    # Compact arbitrary ids to 0..G-1 so the per-group buffers have G entries.
    _, gid = torch.unique(group_index, return_inverse=True)
    num_groups = int(gid.max()) + 1 if gid.numel() else 0

    finite = torch.isfinite(rewards)
    r = torch.where(finite, rewards, 0.0)
    count = torch.zeros(num_groups, dtype=dtype, device=r.device).index_add_(
        0, gid, finite.to(dtype)
    )
    sums = torch.zeros_like(count).index_add_(0, gid, r)
    mean = sums / count.clamp_min(1)

    # Degenerate groups: max == min over the finite rewards, or fewer than 2 of them.
    inf = torch.tensor(float("inf"), dtype=dtype, device=r.device)
    gmax = torch.full_like(count, -inf).scatter_reduce(
        0, gid, torch.where(finite, r, -inf), reduce="amax"
    )
    gmin = torch.full_like(count, inf).scatter_reduce(
        0, gid, torch.where(finite, r, inf), reduce="amin"
    )
    informative = (count >= 2) & (gmax > gmin)

    denom = scale_fn(r, finite, gid, mean, count, total or _one_process)
    adv = (r - mean[gid]) / denom
    return torch.where(finite & informative[gid], adv, 0.0)


def group_advantages(rewards: Tensor, scale: str = "group", total: Optional[Total] = None) -> Tensor:
    """Advantages of a dense batch of groups.

    Args:
        rewards: [P, G] float, row p holds the G rewards of prompt p; NaN = unscorable.
        scale: a name in ``ADVANTAGE_SCALES``.
        total: as ``grouped_advantages``'s.

    Returns:
        [P, G] advantages (see ``grouped_advantages``, which this delegates to).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, G]; got {tuple(rewards.shape)}")
    p, g = rewards.shape
    group_index = torch.arange(p, device=rewards.device).repeat_interleave(g)
    return grouped_advantages(rewards.reshape(-1), group_index, scale, total).reshape(p, g)


# --------------------------------------------------------------------------- token level


def token_returns(rewards: Tensor, kl: Optional[Tensor], mask: Tensor, kl_coef: float = 0.0,
                  gamma: float = 1.0) -> Tensor:
    """REINFORCE++'s per-token rewards and their returns, before whitening.

    ``r_t = -kl_coef * kl_t`` on every valid token, plus the outcome reward on the last valid
    token of the row; ``G_t = sum_{s >= t} gamma^(s - t) r_s``.

    Args:
        rewards: [B] outcome rewards (shaped); a non-finite one makes its row all 0.
        kl: [B, T] per-token KL estimate to the reference, or None (no KL in the reward).
        mask: [B, T] valid response tokens (bool or 0/1).
        kl_coef: the KL's weight in the reward (>= 0).
        gamma: discount in (0, 1].

    Returns:
        [B, T] returns, 0 off the mask and on unscorable rows; dtype at least float32.
    """
    if rewards.dim() != 1 or mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"rewards must be [B] and mask [B, T]; got {tuple(rewards.shape)} and {tuple(mask.shape)}")
    if kl is not None and kl.shape != mask.shape:
        raise ValueError(f"kl must be [B, T] like mask; got {tuple(kl.shape)} and {tuple(mask.shape)}")
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    finite = torch.isfinite(rewards)
    rows = (mask != 0) & finite[:, None]  # [B, T] tokens that carry reward and statistics
    token_reward = torch.zeros(mask.shape, dtype=dtype, device=rewards.device)
    if kl is not None and kl_coef:
        # where(), not * mask: padding may hold inf (a -inf log-prob's KL).
        token_reward = torch.where(rows, -kl_coef * kl.to(dtype), 0.0)
    width = mask.shape[1]
    # Last valid token of each row (OpenRLHF's ``eos_indices``; verl's reward manager writes the
    # score at ``valid_response_length - 1``, the same token for a contiguous mask).
    last = width - 1 - rows.flip(1).to(torch.int8).argmax(dim=1)
    has = rows.any(dim=1)
    token_reward[has, last[has]] += rewards.to(dtype)[has]
    if gamma == 1.0:
        returns = token_reward.flip(1).cumsum(1).flip(1)
    else:
        returns = torch.zeros_like(token_reward)
        running = torch.zeros(mask.shape[0], dtype=dtype, device=rewards.device)
        for t in range(width - 1, -1, -1):
            running = token_reward[:, t] + gamma * running
            returns[:, t] = running
    return torch.where(rows, returns, 0.0)


def whiten(values: Tensor, mask: Tensor, total: Optional[Total] = None,
           eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(max(var, eps))`` over the masked entries of the whole batch, mean
    kept out (OpenRLHF's normalisation: population variance, clamped).

    ``total`` sums a list of floats over every process (``RankSync.sum``), so that mean and
    variance are over every rank's entries (two sums: the count and the sum, then the squared
    deviations, which is stabler than a sum of squares). Returns 0 off the mask."""
    total = total or _one_process
    valid = mask != 0
    x = torch.where(valid, values, 0.0)
    count, s1 = total([float(valid.sum()), float(x.sum())])
    if count <= 0:
        return torch.zeros_like(x)
    mean = s1 / count
    (sq,) = total([float((torch.where(valid, x - mean, 0.0) ** 2).sum())])
    var = max(sq / count, eps)
    return torch.where(valid, (x - mean) / var ** 0.5, 0.0)


@TOKEN_ADVANTAGES.register("reinforce_plus_plus")
def reinforce_plus_plus_advantages(
    rewards: Tensor,
    kl: Optional[Tensor],
    mask: Tensor,
    settings: TokenAdvantageSettings = TokenAdvantageSettings(),  # noqa: B008 - frozen
    total: Optional[Total] = None,
) -> Tensor:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): token returns of the KL-penalised reward,
    normalised over the whole batch's tokens; no critic, no group baseline.

    ``A_t = (G_t - mean(G)) / sqrt(max(var(G), 1e-8))`` with ``G`` = ``token_returns`` and
    mean and population variance over every valid token of the batch (of every process when
    ``total`` sums across them).

    Which detail follows which peer (read in verl's ``core_algos.py``
    ``compute_reinforce_plus_plus_outcome_advantage``, ``ray_trainer.apply_kl_penalty``, and
    OpenRLHF's ``experience_maker.py`` and ``models/utils.compute_reward``):

    - The KL: the caller's estimate per token, both peers' default is k1, ``log pi_old -
      log pi_ref`` where pi_old is the policy that sampled (the trainer's recomputed log-probs in
      both; verl's bypass mode uses the engine's). ibpo-lit passes the engine's sampled
      log-probs (the same distribution as the trainer's, ``softmax(logits / T)`` before the
      sampling filters) so no extra policy forward is needed. Not clamped (verl's k1;
      OpenRLHF clamps every estimator to [-10, 10]).
    - The outcome reward sits on the last valid token (both peers).
    - Returns: ``G_t = r_t + gamma * G_{t+1}``, reset past the last valid token (verl) /
      rewards masked first (OpenRLHF); gamma 1 by default in both.
    - Normalisation over every valid token of the whole batch, the mean subtracted (both; verl's
      ``masked_whiten(shift_mean=True)``). The variance is the population one clamped at 1e-8
      (OpenRLHF: ``var.clamp(min=1e-8).rsqrt()``); verl uses the Bessel-corrected variance plus
      1e-8, a factor ``sqrt(n / (n - 1))`` over n tokens (< 1e-3 relative above 500 tokens).
    - Both peers compute it on the driver over the whole batch; here each process holds its
      share and ``total`` makes the statistics global.
    - Unscorable rows (non-finite reward, ibpo-lit's own case): advantage 0, left out of the
      statistics. Advantages are 0 off the mask (verl multiplies by the mask; OpenRLHF leaves
      padding whatever it is, the loss masks it).

    Args:
        rewards: [B] outcome (shaped) rewards, NaN = unscorable.
        kl: [B, T] per-token KL estimate, or None (no KL in the reward).
        mask: [B, T] valid response tokens.
        settings: ``kl_coef`` (beta of the KL in the reward) and ``gamma``.
        total: sums a list of floats over every process (default: this one only).

    Returns:
        [B, T] token advantages, dtype at least float32.
    """
    returns = token_returns(rewards, kl, mask, settings.kl_coef, settings.gamma)
    valid = (mask != 0) & torch.isfinite(rewards)[:, None]
    return whiten(returns, valid, total)


def is_token_level(name: str) -> bool:
    """Whether ``algorithm.advantage_scale`` names a token-level estimator (``TOKEN_ADVANTAGES``:
    [B, T] advantages of a whole batch, a KL in the reward) rather than a group-relative one
    (``ADVANTAGE_SCALES``: [B] advantages per group). An unknown name raises, listing both."""
    if name in TOKEN_ADVANTAGES:
        return True
    if name in ADVANTAGE_SCALES:
        return False
    raise ValueError(f"unknown advantage estimator {name!r}; valid: "
                     f"{', '.join(sorted(ADVANTAGE_SCALES.names() + TOKEN_ADVANTAGES.names()))}")


def rows_with_advantage(advantages: Tensor) -> Tensor:
    """[B] bool: the rows with a non-zero advantage, from [B] or [B, T] advantages (a row
    whose advantages are all 0 adds nothing to the policy loss)."""
    nonzero = advantages != 0
    return nonzero if nonzero.dim() == 1 else nonzero.any(dim=-1)
