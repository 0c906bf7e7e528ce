"""Name -> implementation tables, so a YAML config can pick a loss, an advantage scale, a
shaping variant or an aggregation by name (verl's ``register_policy_loss`` pattern).

The tables are filled by the modules that define the entries (``gspo.py``, ``grpo.py``,
``advantages.py``, ``aggregation.py``, ``shaping.py``); importing ``ibpo_lit.algorithms``
imports all of them, so the tables are complete whenever this module is reachable.

Contracts of the entries:

- ``POLICY_LOSSES[name](inputs: LossInputs, settings: LossSettings) -> (loss, metrics)``: every
  loss takes the same two arguments, so the caller never branches on the loss's name.
  ``inputs`` holds logp, old_logp, mask, token_weights [B, T], advantages [B] (one per
  sequence) or [B, T] (one per token, the token-level estimators'), and ``num_seqs`` /
  ``num_tokens``, the GLOBAL counts of the whole batch when the caller splits it into
  micro-batches (see ``aggregation.py``). ``settings`` holds the clip range and GRPO's
  aggregation (from ``algorithm``; a loss ignores what it has no use for: GSPO is always a mean
  over each sequence's tokens, then sequences). The KL and entropy terms are added to every
  loss by the caller (``regularizers.py``). loss is a scalar to
  minimise; metrics a dict of detached scalar tensors. The pure formulas (``gspo_loss``,
  ``grpo_loss``) keep their own keyword signatures; the entries adapt them.
- ``ADVANTAGE_SCALES[name](rewards, finite, group_index, group_mean, group_count, total) -> [B]``:
  the denominator of ``A = (r - mean_g) / denominator`` (see ``advantages.py``): the
  group-relative estimators, one advantage per sequence, computed per group. ``total`` sums a
  list of floats over every process (as below); a scale with batch-wide statistics ("batch")
  sums through it, a per-group one ignores it.
- ``TOKEN_ADVANTAGES[name](rewards, kl, mask, settings, total) -> [B, T]``: the token-level
  estimators (REINFORCE++), one advantage per token from the outcome reward and a per-token
  KL put into the reward: ``rewards`` [B] (NaN = unscorable), ``kl`` [B, T] or None (no KL in
  the reward), ``mask`` [B, T], ``settings`` a ``TokenAdvantageSettings``, ``total`` a
  function summing a list of floats over every process (identity in one), so that batch
  statistics are the whole run's. They have no groups: a caller hands them its whole batch.
  ``algorithm.advantage_scale`` names an entry of either table (``advantages.py``'s
  ``is_token_level`` says which); every policy loss takes advantages [B] or [B, T].
- ``AGGREGATIONS[name](loss_mat, mask, num_seqs, num_tokens) -> scalar`` (``aggregation.py``).
- ``SHAPING_VARIANTS[name](beta, kept_fraction, changed) -> (Delta, token_weights)`` for the
  rows where the IBPO condition holds (``shaping.py``): ``kept_fraction`` a float or [B],
  ``changed`` the [B, T] float mask of response tokens the correction changed (None for the
  scalar reference); ``token_weights`` [B, T] or None (every token weight 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from torch import Tensor

from ibpo_lit.registry import Registry


@dataclass(frozen=True)
class LossSettings:
    """A policy loss's settings, from ``algorithm`` (see ``AlgorithmConfig``)."""

    eps_low: float
    eps_high: float
    agg_mode: Optional[str] = None  # GRPO's aggregation (None: the loss's default)


@dataclass(frozen=True)
class TokenAdvantageSettings:
    """A token-level advantage estimator's settings, from ``algorithm`` (``AlgorithmConfig``)."""

    kl_coef: float = 0.0  # weight of the per-token KL in the reward (``algorithm.beta_kl``)
    gamma: float = 1.0  # discount of the token returns (``algorithm.gamma``)


@dataclass
class LossInputs:
    """What every policy loss is computed from (shapes in the module docstring)."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    token_weights: Optional[Tensor] = None
    num_seqs: Optional[float] = None
    num_tokens: Optional[float] = None


POLICY_LOSSES = Registry("policy loss")
ADVANTAGE_SCALES = Registry("advantage scale")
TOKEN_ADVANTAGES = Registry("token-level advantage estimator")
SHAPING_VARIANTS = Registry("shaping variant")
AGGREGATIONS = Registry("aggregation mode")


def get_policy_loss(name: str) -> Callable:
    return POLICY_LOSSES.get(name)


def get_advantage_scale(name: str) -> Callable:
    return ADVANTAGE_SCALES.get(name)


def get_shaping_variant(name: str) -> Callable:
    return SHAPING_VARIANTS.get(name)


def get_aggregation(name: str) -> Callable:
    return AGGREGATIONS.get(name)
