"""The formulas of docs/METHOD.md as pure tensor functions (no Lightning, no models, no I/O).

Importing this package fills the registries (``POLICY_LOSSES``, ``ADVANTAGE_SCALES``,
``TOKEN_ADVANTAGES``,
``SHAPING_VARIANTS``, ``AGGREGATIONS``, ``KL_ESTIMATORS``), so a config can name any entry.
Every policy loss is called the same way, and the KL and entropy terms are added to any of them::

    loss, metrics = POLICY_LOSSES.get(name)(
        LossInputs(logp, old_logp, advantages, mask, token_weights=w, num_seqs=n_seqs,
                   num_tokens=n_tokens), LossSettings(eps_low, eps_high, ...))
    extra, more = regularizers(logp, mask, RegularizerSettings(beta_kl, "k3", entropy_coef),
                               ref_logp=ref, entropy=h, num_seqs=n_seqs, num_tokens=n_tokens)

with logp, old_logp, mask, w [B, T], advantages [B] or [B, T] (token-level estimators), and ``num_seqs`` / ``num_tokens`` the
GLOBAL counts of the whole batch under micro-batching (``aggregation.py``); see
``registry.py`` for the full contract of each table.
"""
from ibpo_lit.algorithms.advantages import (
    group_advantages,
    grouped_advantages,
    is_token_level,
    reinforce_plus_plus_advantages,
    rows_with_advantage,
    token_returns,
    whiten,
)
from ibpo_lit.algorithms.aggregation import aggregate
from ibpo_lit.algorithms.edit_alignment import (
    adaptive_alpha,
    is_full_rewrite,
    kept_positions,
    normalized_edit_distance,
)
from ibpo_lit.algorithms.grpo import grpo_loss
from ibpo_lit.algorithms.gspo import gspo_loss
from ibpo_lit.algorithms.logprobs import token_entropy, token_logprobs
from ibpo_lit.algorithms.registry import (
    ADVANTAGE_SCALES,
    AGGREGATIONS,
    POLICY_LOSSES,
    SHAPING_VARIANTS,
    TOKEN_ADVANTAGES,
    LossInputs,
    LossSettings,
    Registry,
    TokenAdvantageSettings,
    get_advantage_scale,
    get_aggregation,
    get_policy_loss,
    get_shaping_variant,
)
from ibpo_lit.algorithms.regularizers import (
    KL_ESTIMATORS,
    RegularizerSettings,
    regularizers,
    token_kl,
)
from ibpo_lit.algorithms.shaping import (
    ShapingResult,
    ibpo_delta,
    shape_rewards,
    validate_shaping,
)

__all__ = [
    "ADVANTAGE_SCALES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "RegularizerSettings",
    "regularizers",
    "token_entropy",
    "LossInputs",
    "LossSettings",
    "POLICY_LOSSES",
    "SHAPING_VARIANTS",
    "TOKEN_ADVANTAGES",
    "TokenAdvantageSettings",
    "is_token_level",
    "reinforce_plus_plus_advantages",
    "rows_with_advantage",
    "token_kl",
    "token_returns",
    "whiten",
    "Registry",
    "ShapingResult",
    "adaptive_alpha",
    "aggregate",
    "get_advantage_scale",
    "get_aggregation",
    "get_policy_loss",
    "get_shaping_variant",
    "group_advantages",
    "grouped_advantages",
    "grpo_loss",
    "gspo_loss",
    "ibpo_delta",
    "is_full_rewrite",
    "kept_positions",
    "normalized_edit_distance",
    "shape_rewards",
    "token_logprobs",
    "validate_shaping",
]
