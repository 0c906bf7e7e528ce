"""Rollout correction: importance weights between the trainer's and the rollout engine's
log-probs of the sampled tokens: truncated importance sampling (TIS) and rejection (MIS / RS).

The engine that samples (vLLM in bf16 with its own kernels, or an engine holding weights a
step or more behind) is not the distribution the loss takes as ``pi_old`` (the trainer's own
forward). The policy gradient is an expectation under ``pi_old``; the samples come from
``pi_engine``. Reweighting each sampled token by ``pi_old / pi_engine`` makes the estimate one
under ``pi_old`` again; capping or rejecting the weights bounds its variance.

Per policy token ``t`` of a row (tool-output tokens are out of ``mask``), with
``log r_t = log pi_trainer(y_t) - log pi_engine(y_t)``, safety-bounded to [-20, 20] before any
``exp`` (verl's ``SAFETY_BOUND``):

- IS weights, ``rollout_is``:
  ``token``: ``w_t = min(r_t, C)``;
  ``sequence``: ``w_t = min(exp(sum_s log r_s), C)`` on every token of the row (the row's
  product of ratios, bounded to exp(+-20) before the cap);
  ``None``: ``w_t = 1``. ``C`` is ``rollout_is_threshold``. No lower truncation (verl's choice:
  small weights cannot blow the variance up; raising them would only add bias).
- Rejection, ``rollout_rs``: one or more of verl's options (all must pass), each a statistic of
  KL(pi_engine || pi_trainer) on the tokens sampled from the engine:
  ``k1 = -log r``, ``k2 = (log r)^2 / 2``, ``k3 = r - 1 - log r``. ``token_kX`` tests every
  token on its own; ``seq_sum_kX``, ``seq_mean_kX`` (k1: the geometric mean, "Geo-RS") and
  ``seq_max_kX`` (k2, k3) test the sum, mean or max over a row's tokens and keep or reject the
  whole row. A ``k1`` option keeps ``lower <= exp(k1) <= upper``: a band on
  ``pi_engine / pi_trainer`` (``1 / r``, verl's convention, k1 being the estimator of
  KL(engine || trainer)); a single number ``u`` means the band ``[1/u, u]``, symmetric, so the
  same band on ``r``. ``k2`` / ``k3`` keep ``statistic <= upper``.
- The weight applied: ``w_t * keep_t``; 0 off the mask.

Where the weights go (``ibpo_lit.training.update``): they multiply the loss's per-token weights
``w_t`` (IBPO-mask, CIW), so with GRPO each token's clipped term and with GSPO each token's term
of GSPO-token (METHOD section 3), verl's and TRL's choice. The weights are constants (computed
from detached log-probs): they change the measure, not the objective.

Choices (where verl and TRL differ or are silent):
- A rejected token keeps its place in the loss's denominators, with weight 0 (TRL's
  ``*_mask`` modes do the same; verl removes it from the response mask, so its token-mean
  denominator shrinks). The estimate stays an average over what was sampled, and the global
  denominators (counted before any forward, ``aggregation.py``) stay exact under micro-batching.
- The statistics are kept as sums (`CorrectionStats`) so that micro-batches add up exactly to
  the batch's; ``metrics()`` turns them into means at the end of a step.

Not covered: verl's ``rollout_is_batch_normalize``, its ``bypass_mode`` / ``loss_type`` (our
``rollout.old_logp: rollout`` is its bypass mode with the PPO-clip loss, where the ratio itself
is taken against the engine and there is nothing left to weight), TRL's lower truncation
(``vllm_importance_sampling_clip_min`` in its ``*_truncate`` modes).

Sources read (to understand, not copied): verl ``docs/algo/rollout_corr.md`` and
``verl/trainer/ppo/rollout_corr_helper.py`` (commit b178a3c, 2026-01-29), its GSPO loss in
``core_algos.py`` (IS weights multiply the per-token GSPO-token losses); TRL ``grpo_config.py``
and ``grpo_trainer.py`` (commit f2cd577, 2026-07-24): ``vllm_importance_sampling_correction``,
``vllm_importance_sampling_mode`` (``token_truncate``, ``token_mask``, ``sequence_truncate``,
``sequence_mask``), ``vllm_importance_sampling_clip_max`` (formerly ``_cap``) and ``_clip_min``.
docs/rollouts.md maps their names onto these.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ibpo_lit.registry import Registry

SAFETY_BOUND = 20.0  # |log r| at most 20 before exp: weights within [2e-9, 5e8]
IS_LEVELS = ("token", "sequence")


# ---------------------------------------------------------------------------- rejection options
@dataclass(frozen=True)
class RejectionOption:
    """A ``rollout_rs`` option: ``statistic(log_ratio, valid) -> [B, T]`` (a sequence option's
    row value on each of its tokens); ``band``: kept within ``[log lower, log upper]`` (k1),
    else at most ``upper`` (k2, k3)."""

    statistic: Callable[[Tensor, Tensor], Tensor]
    band: bool


REJECTION_OPTIONS = Registry("rollout_rs option")

_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": lambda lr: -lr,
    "k2": lambda lr: 0.5 * lr * lr,
    "k3": lambda lr: torch.exp(lr) - 1.0 - lr,
}


def _row_sum(x: Tensor, valid: Tensor) -> Tensor:
    return torch.where(valid, x, 0.0).sum(-1)


def _row_mean(x: Tensor, valid: Tensor) -> Tensor:
    return _row_sum(x, valid) / valid.sum(-1).clamp_min(1)


def _row_max(x: Tensor, valid: Tensor) -> Tensor:
    top = torch.where(valid, x, -math.inf).max(-1).values
    return torch.where(valid.any(-1), top, 0.0)  # an empty row: 0, never rejected by an upper bound


_AGGREGATES: dict[str, Optional[Callable[[Tensor, Tensor], Tensor]]] = {
    "token": None, "seq_sum": _row_sum, "seq_mean": _row_mean, "seq_max": _row_max,
}


def _option(estimator: Callable[[Tensor], Tensor], aggregate) -> Callable[[Tensor, Tensor], Tensor]:
    def statistic(log_ratio: Tensor, valid: Tensor) -> Tensor:
        per_token = estimator(log_ratio)
        if aggregate is None:
            return per_token
        return aggregate(per_token, valid)[:, None].expand_as(per_token)

    return statistic


for _agg, _fn in _AGGREGATES.items():
    for _k, _est in _ESTIMATORS.items():
        if _agg == "seq_max" and _k == "k1":
            continue  # verl has no seq_max_k1: k1 takes either sign, a max of it bounds nothing useful
        REJECTION_OPTIONS.register(f"{_agg}_{_k}")(RejectionOption(_option(_est, _fn), band=_k == "k1"))


@dataclass(frozen=True)
class RejectionBound:
    """One parsed ``rollout_rs`` option with its threshold: ``lower`` (k1 only) and ``upper``."""

    option: str
    upper: float
    lower: Optional[float] = None


# ---------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class RolloutCorrectionSettings:
    """What the formula is given (``RolloutCorrectionConfig`` builds it; `parse` validates).

    ``rollout_is``: ``token``, ``sequence`` or None (no IS weights); ``rollout_is_threshold``: the
    cap C; ``rejection``: the parsed ``rollout_rs`` options (empty: no rejection)."""

    rollout_is: Optional[str] = "token"
    rollout_is_threshold: float = 2.0
    rejection: tuple[RejectionBound, ...] = ()

    @staticmethod
    def parse(rollout_is: Optional[str], rollout_is_threshold: float, rollout_rs: Optional[str],
              rollout_rs_threshold: Union[float, str, None]) -> "RolloutCorrectionSettings":
        """Settings from verl's four fields; ``ValueError`` naming the field otherwise."""
        if rollout_is is not None and rollout_is not in IS_LEVELS:
            raise ValueError(f"rollout_is must be token, sequence or null, got {rollout_is!r}")
        if not (isinstance(rollout_is_threshold, (int, float)) and rollout_is_threshold > 0):
            raise ValueError(f"rollout_is_threshold must be a number > 0, got {rollout_is_threshold!r}")
        return RolloutCorrectionSettings(rollout_is, float(rollout_is_threshold),
                                         parse_rejection(rollout_rs, rollout_rs_threshold))

    @property
    def active(self) -> bool:
        """Whether it changes any weight: IS weights or a rejection test."""
        return self.rollout_is is not None or bool(self.rejection)

    def describe(self) -> str:
        """A few words for logs and messages: ``token IS, cap 2`` / ``... + rejection seq_mean_k1``."""
        parts = [f"{self.rollout_is} IS, cap {self.rollout_is_threshold:g}"] if self.rollout_is else []
        parts += [f"rejection {', '.join(b.option for b in self.rejection)}"] if self.rejection else []
        return " + ".join(parts) or "nothing"


def parse_rejection(rollout_rs: Optional[str], threshold: Union[float, str, None]) -> tuple[RejectionBound, ...]:
    """verl's ``rollout_rs`` (options, comma-separated) and ``rollout_rs_threshold`` (one entry
    shared by every option, or one per option, comma-separated; k1: ``lower_upper`` or ``u`` for
    ``[1/u, u]``; k2/k3: an upper bound)."""
    if rollout_rs is None or not str(rollout_rs).strip():
        if threshold is not None:
            raise ValueError(f"rollout_rs_threshold={threshold!r} is set but rollout_rs is not: set both or neither")
        return ()
    options = list(dict.fromkeys(o.strip() for o in str(rollout_rs).split(",") if o.strip()))
    unknown = [o for o in options if o not in REJECTION_OPTIONS]
    if unknown:
        raise ValueError(f"rollout_rs: unknown option {', '.join(map(repr, unknown))}; valid: "
                         f"{', '.join(REJECTION_OPTIONS.names())} (verl's names, comma-separated)")
    if threshold is None:
        raise ValueError(f"rollout_rs={rollout_rs!r} needs rollout_rs_threshold (e.g. 2.0, or '0.5_2.0' for a k1 band)")
    entries = [threshold] if isinstance(threshold, (int, float)) else [s.strip() for s in str(threshold).split(",")]
    if len(entries) == 1:
        entries = entries * len(options)
    if len(entries) != len(options) or any(e == "" for e in entries):
        raise ValueError(f"rollout_rs_threshold={threshold!r}: give one threshold for every option of "
                         f"rollout_rs={rollout_rs!r}, or a single one for all")
    return tuple(_bound(option, entry) for option, entry in zip(options, entries))


def _bound(option: str, entry: Union[float, str]) -> RejectionBound:
    text = str(entry)
    try:
        numbers = [float(x) for x in text.split("_")]
    except ValueError:
        raise ValueError(f"rollout_rs_threshold for {option}: {text!r} is not a number"
                         + (" nor 'lower_upper'" if REJECTION_OPTIONS.get(option).band else "")) from None
    if REJECTION_OPTIONS.get(option).band:
        if len(numbers) == 1:
            numbers = [1.0 / numbers[0], numbers[0]] if numbers[0] > 0 else numbers * 2
        if len(numbers) != 2 or not 0 < numbers[0] <= numbers[1]:
            raise ValueError(f"rollout_rs_threshold for {option}: {text!r} must be a band 'lower_upper' with "
                             "0 < lower <= upper, or one number u >= 1 for [1/u, u]")
        return RejectionBound(option, upper=numbers[1], lower=numbers[0])
    if len(numbers) != 1 or not numbers[0] > 0:
        raise ValueError(f"rollout_rs_threshold for {option}: {text!r} must be one upper bound > 0 "
                         "(only k1 options take a 'lower_upper' band)")
    return RejectionBound(option, upper=numbers[0])


# ---------------------------------------------------------------------------- statistics
@dataclass
class CorrectionStats:
    """Sums over the policy tokens (and rows) the weights were computed for; `add` combines
    micro-batches exactly, `metrics` gives the means. Tensors stay on their device until then."""

    tokens: Tensor = field(default_factory=lambda: torch.zeros(()))
    rows: Tensor = field(default_factory=lambda: torch.zeros(()))  # rows with at least one policy token
    weight_sum: Tensor = field(default_factory=lambda: torch.zeros(()))
    weight_sq_sum: Tensor = field(default_factory=lambda: torch.zeros(()))
    truncated: Tensor = field(default_factory=lambda: torch.zeros(()))  # tokens whose IS weight hit the cap
    rejected: Tensor = field(default_factory=lambda: torch.zeros(()))  # tokens rejected
    rejected_rows: Tensor = field(default_factory=lambda: torch.zeros(()))  # rows with a rejected token
    seq_kl_k1: Tensor = field(default_factory=lambda: torch.zeros(()))  # sum over rows of sum_t k1
    seq_kl_k3: Tensor = field(default_factory=lambda: torch.zeros(()))  # ... of sum_t k3
    ratio_max: Tensor = field(default_factory=lambda: torch.full((), -math.inf))  # IS ratio, before the cap
    ratio_min: Tensor = field(default_factory=lambda: torch.full((), math.inf))

    _SUMMED = ("tokens", "rows", "weight_sum", "weight_sq_sum", "truncated", "rejected", "rejected_rows",
               "seq_kl_k1", "seq_kl_k3")

    def add(self, other: "CorrectionStats") -> None:
        for name in self._SUMMED:
            setattr(self, name, getattr(self, name).to(getattr(other, name).device) + getattr(other, name))
        self.ratio_max = torch.maximum(self.ratio_max.to(other.ratio_max.device), other.ratio_max)
        self.ratio_min = torch.minimum(self.ratio_min.to(other.ratio_min.device), other.ratio_min)

    def metrics(self, prefix: str = "rollout_corr/") -> dict[str, float]:
        """``weight_mean`` / ``weight_std`` (of the weight each policy token's loss term is
        multiplied by: the capped IS weight times keep), ``ratio_max`` / ``ratio_min`` (the IS
        ratio at its level, before the cap; the token ratio without IS weights),
        ``truncated_frac`` and ``rejected_frac`` (shares of policy tokens), ``rejected_seq_frac``
        (share of rows with a rejected token), ``seq_kl_k1`` / ``seq_kl_k3`` (per row, the sum
        over its tokens of k1 or k3: estimates of KL(pi_engine || pi_trainer) of whole responses,
        k1 unbiased, k3 >= 0 with less variance; mean over rows). NaN for all when no token was
        seen (a process whose rows were all skipped)."""
        n, rows = float(self.tokens), float(self.rows)
        names = ("weight_mean", "weight_std", "ratio_max", "ratio_min", "truncated_frac", "rejected_frac",
                 "rejected_seq_frac", "seq_kl_k1", "seq_kl_k3")
        if n == 0:
            return {prefix + name: math.nan for name in names}
        mean = float(self.weight_sum) / n
        var = max(float(self.weight_sq_sum) / n - mean * mean, 0.0)
        values = (mean, math.sqrt(var), float(self.ratio_max), float(self.ratio_min), float(self.truncated) / n,
                  float(self.rejected) / n, float(self.rejected_rows) / rows, float(self.seq_kl_k1) / rows,
                  float(self.seq_kl_k3) / rows)
        return {prefix + name: value for name, value in zip(names, values)}


# ---------------------------------------------------------------------------- the formula
def rollout_correction(
    trainer_logp: Tensor,
    engine_logp: Tensor,
    mask: Tensor,
    settings: RolloutCorrectionSettings,
) -> tuple[Tensor, CorrectionStats]:
    """Correction weights of the sampled tokens, and their statistics.

    Args:
        trainer_logp: [B, T] log pi of the sampled tokens under the policy the loss takes as
            ``pi_old`` (the trainer's forward; where ``pi_old`` is not kept, the current policy's
            before its first update). Detached here.
        engine_logp: [B, T] log-probs of the same tokens under the distribution they were sampled
            from (``RolloutBatch.rollout_logp``).
        mask: [B, T] bool (or 0/1), True on the tokens the policy sampled (``policy_mask``: no
            padding, no tool output).
        settings: levels, cap, rejection options.

    Returns:
        weights: [B, T] float32, ``w_t * keep_t`` on the mask, 0 off it; no gradient.
        stats: `CorrectionStats` of this batch.
    """
    if not (trainer_logp.shape == engine_logp.shape == mask.shape) or mask.dim() != 2:
        raise ValueError(f"trainer_logp, engine_logp and mask must all be [B, T]; got {tuple(trainer_logp.shape)}, "
                         f"{tuple(engine_logp.shape)}, {tuple(mask.shape)}")
    valid = mask != 0
    # where(), not * mask: padding may hold -inf log-probs.
    log_ratio = torch.where(valid, trainer_logp.detach().float() - engine_logp.detach().float(), 0.0)
    bounded = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B, T]

    if settings.rollout_is == "sequence":
        level_log = log_ratio.sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)[:, None].expand_as(log_ratio)
    else:  # token, and the ratio reported without IS weights
        level_log = bounded
    ratio = torch.exp(level_log)  # [B, T], before the cap
    if settings.rollout_is is not None:
        weights = ratio.clamp(max=settings.rollout_is_threshold)
        truncated = valid & (ratio > settings.rollout_is_threshold)
    else:
        weights, truncated = torch.ones_like(ratio), torch.zeros_like(valid)

    keep = torch.ones_like(valid)
    for bound in settings.rejection:
        option = REJECTION_OPTIONS.get(bound.option)
        stat = option.statistic(bounded, valid)
        if option.band:
            ok = (stat >= math.log(bound.lower)) & (stat <= math.log(bound.upper))
        else:
            ok = stat <= bound.upper
        keep &= ok
    rejected = valid & ~keep
    weights = torch.where(valid & keep, weights, 0.0)

    with torch.no_grad():
        nonempty = valid.any(-1)
        applied = torch.where(valid, weights, 0.0)
        stats = CorrectionStats(
            tokens=valid.sum().float(),
            rows=nonempty.sum().float(),
            weight_sum=applied.sum(),
            weight_sq_sum=(applied * applied).sum(),
            truncated=truncated.sum().float(),
            rejected=rejected.sum().float(),
            rejected_rows=rejected.any(-1).sum().float(),
            seq_kl_k1=_row_sum(_ESTIMATORS["k1"](bounded), valid).sum(),
            seq_kl_k3=_row_sum(_ESTIMATORS["k3"](bounded), valid).sum(),
            ratio_max=torch.where(valid, ratio, -math.inf).max() if valid.any() else torch.full((), -math.inf),
            ratio_min=torch.where(valid, ratio, math.inf).min() if valid.any() else torch.full((), math.inf),
        )
    return weights, stats
