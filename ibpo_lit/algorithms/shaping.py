"""IBPO reward shaping (METHOD section 5): ``r'_i = r_i + lambda * Delta_i``.

``Delta_i`` is non-zero only when the IBPO condition holds:
``r_i == 0 and r(x, y^_i) == 1 and not rewrite_i``. Variants (``SHAPING_VARIANTS``):
- "plain": ``Delta = beta``;
- "ratio" (IBPO-ratio): ``Delta = |U| / T``, the share of the response the correction kept;
- "mask" (IBPO-mask): ``Delta = beta`` and, on those rows, token weights ``1[t not in U]``
  (only changed tokens get gradient; every other row keeps weight 1);
- "none": ``Delta = 0`` (the GSPO baseline through the same code path).

Choices the paper leaves open:
- A NaN reward (unscorable rollout) or NaN correction reward (no correction made or it could
  not be scored) makes the condition false; a NaN reward stays NaN after shaping.
- Rewards are compared exactly with 0 and 1 (binary verifiers); a partial-credit reward never
  triggers shaping.
- "mask" keeps ``Delta = beta`` in the reward as well as masking tokens.
- "ratio" ignores ``beta``: its maximum Delta is 1, so ``lambda < 1`` is required.
- ``T`` is the response length from ``response_mask``, clamped to >= 1.

Not covered here: choosing the reference, generating and scoring corrections, and the
rewrite test itself (``edit_alignment.py``); this module only combines their outcomes.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ibpo_lit.algorithms.registry import SHAPING_VARIANTS


# Each entry maps (beta, kept_fraction, changed) -> (Delta, token_weights) for the rows where
# the condition holds; kept_fraction is a float or a [B] tensor, changed the [B, T] float mask
# of the response tokens the correction changed (None in the scalar reference). The maximum
# Delta over kept_fraction in [0, 1] is fn(beta, 1.0, None)[0].
@SHAPING_VARIANTS.register("none")
def _delta_none(beta, kept_fraction, changed):
    return 0.0, None


@SHAPING_VARIANTS.register("plain")
def _delta_plain(beta, kept_fraction, changed):
    return beta, None


@SHAPING_VARIANTS.register("ratio")
def _delta_ratio(beta, kept_fraction, changed):
    if kept_fraction is None:
        raise ValueError("shaping variant 'ratio' needs kept_fraction (|U| / T)")
    return kept_fraction, None


@SHAPING_VARIANTS.register("mask")
def _delta_mask(beta, kept_fraction, changed):
    return beta, changed  # only the tokens the correction changed get gradient


class ShapingResult(NamedTuple):
    shaped_rewards: Tensor  # [B] r + lam * delta, NaN where r is NaN
    delta: Tensor  # [B] Delta_i, 0 where the condition fails
    token_weights: Tensor | None  # [B, T] float for "mask", else None


def validate_shaping(variant: str, lam: float, beta: float) -> None:
    """Reject settings outside ``0 <= lambda * Delta < 1`` (METHOD section 5), naming the
    parameter; also rejects an unknown variant (``ValueError`` listing the valid names)."""
    delta_fn = SHAPING_VARIANTS.get(variant)
    if lam < 0:
        raise ValueError(f"shaping lam must be >= 0; got {lam}")
    if beta < 0:
        raise ValueError(f"shaping beta must be >= 0; got {beta}")
    max_delta = delta_fn(beta, 1.0, None)[0]
    if lam * max_delta >= 1:
        bound = f"beta={beta}" if variant in ("plain", "mask") else f"max Delta={max_delta}"
        raise ValueError(
            f"shaping lam * max Delta must be < 1, so that a shaped wrong rollout stays below "
            f"a correct one; got lam={lam} and {bound} for variant {variant!r}"
        )


def _is_value(x: float | None, target: float) -> bool:
    # NaN == target is False, so only None needs its own test.
    return x is not None and bool(x == target)


def ibpo_delta(
    reward: float | None,
    correction_reward: float | None,
    rewrite: bool,
    variant: str = "plain",
    beta: float = 0.5,
    kept_fraction: float | None = None,
) -> float:
    """Delta_i of one rollout (scalar reference of ``shape_rewards``).

    Args:
        reward: r(x, y_i) in {0, 1}; None or NaN = unscorable.
        correction_reward: r(x, y^_i); None or NaN = no correction.
        rewrite: the full-rewrite filter's verdict for this correction.
        variant: a name in ``SHAPING_VARIANTS``.
        beta: Delta of "plain" and "mask".
        kept_fraction: |U| / T, required by "ratio" when the condition holds.
    """
    delta_fn = SHAPING_VARIANTS.get(variant)
    if not (_is_value(reward, 0) and _is_value(correction_reward, 1) and not rewrite):
        return 0.0
    return float(delta_fn(beta, kept_fraction, None)[0])


def shape_rewards(
    rewards: Tensor,
    correction_rewards: Tensor,
    rewrite: Tensor,
    kept_mask: Tensor,
    response_mask: Tensor,
    variant: str = "plain",
    lam: float = 0.6,
    beta: float = 0.5,
) -> ShapingResult:
    """Shaped rewards (and IBPO-mask token weights) for a batch.

    Args:
        rewards: [B] float, NaN = unscorable.
        correction_rewards: [B] float, NaN = no correction for that row.
        rewrite: [B] bool, the full-rewrite filter's verdict.
        kept_mask: [B, T] bool, response positions the correction kept (U).
        response_mask: [B, T] bool, True on response tokens.
        variant: a name in ``SHAPING_VARIANTS``.
        lam: lambda; beta: Delta of "plain"/"mask". Validated by ``validate_shaping``.

    Returns:
        ``ShapingResult(shaped_rewards [B], delta [B], token_weights [B, T] or None)``.
    """
    validate_shaping(variant, lam, beta)
    delta_fn = SHAPING_VARIANTS.get(variant)
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    rewards = rewards.to(dtype)
    kept = kept_mask.bool() & response_mask.bool()
    kept_fraction = kept.sum(-1).to(dtype) / response_mask.bool().sum(-1).clamp_min(1).to(dtype)

    # NaN == x is False, so unscorable rows and rows without a correction drop out here.
    condition = (rewards == 0) & (correction_rewards.to(dtype) == 1) & ~rewrite.bool()
    changed = (~kept_mask.bool() & response_mask.bool()).to(dtype)
    value, weights = delta_fn(beta, kept_fraction, changed)
    value = torch.as_tensor(value, dtype=dtype, device=rewards.device)
    delta = torch.where(condition, value.expand_as(rewards), 0.0)
    shaped = rewards + lam * delta
    # The variant's token weights apply where it shaped (Delta > 0); every other row keeps 1.
    token_weights = None if weights is None else torch.where((delta > 0)[:, None], weights, torch.ones_like(weights))
    return ShapingResult(shaped, delta, token_weights)
