"""Terms added to any policy loss: a KL penalty to a reference policy, and an entropy bonus.

``loss = policy_loss + beta_kl * aggregate(kl_t) - entropy_coef * aggregate(H_t)``, each term
aggregated like the loss itself (GRPO's ``agg_mode``; GSPO: per sequence, then sequences), with
the same global denominators under micro-batching. As in verl (``kl_loss_type``,
``entropy_coeff``), they apply to every loss, GSPO included.

KL estimators, per token, with ``d = log pi_ref(y_t) - log pi(y_t)`` on tokens sampled from pi
(Schulman's k1/k2/k3). What matters for training is the gradient of the term, not its value:

- ``k1 = -d``: an unbiased estimate of KL(pi || ref), but its gradient is ``grad log pi``, whose
  expectation under pi is 0: as a loss term it does not pull towards the reference at all (it is
  only useful as a reward penalty, or to log).
- ``k2 = d^2 / 2``: biased as a value, but its gradient ``-d * grad log pi`` is, in expectation,
  exactly the gradient of KL(pi || ref), the reverse KL.
- ``k3 = exp(d) - d - 1`` (DeepSeekMath's, verl's ``low_var_kl`` without its clamp; >= 0, low
  variance, unbiased for KL(pi || ref) as a value): its gradient ``(1 - exp(d)) grad log pi`` is,
  in expectation, the gradient of KL(ref || pi), the forward KL. TRL's default differs again (its
  k3 is weighted by the importance ratio to pi_old).

With ``advantage_scale: reinforce_plus_plus`` the KL is not a loss term: ``token_kl`` gives the
per-token estimate that REINFORCE++ subtracts from the reward (``advantages.token_returns``).

The entropy ``H_t`` is the full-distribution entropy at each sampled position, computed from the
logits the loss's forward already holds (``ibpo_lit.training.logprobs``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ibpo_lit.algorithms.aggregation import aggregate
from ibpo_lit.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def token_kl(logp: Tensor, ref_logp: Tensor, mask: Tensor, estimator: str = "k1") -> Tensor:
    """[B, T] float32 per-token KL estimate ``KL_ESTIMATORS[estimator](logp, ref_logp)``, 0 off
    the mask (padding may hold -inf log-probs). REINFORCE++ puts ``-beta * token_kl`` into the
    reward (``advantages.token_returns``)."""
    valid = mask != 0
    kl = KL_ESTIMATORS.get(estimator)(torch.where(valid, logp.float(), 0.0), torch.where(valid, ref_logp.float(), 0.0))
    return torch.where(valid, kl, 0.0)


@dataclass(frozen=True)
class RegularizerSettings:
    """From ``algorithm`` (see ``AlgorithmConfig``)."""

    beta_kl: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    agg_mode: str = "seq-mean-token-mean"  # the loss's own aggregation

    @property
    def needs_ref_logp(self) -> bool:
        return self.beta_kl > 0

    @property
    def needs_every_row(self) -> bool:
        """A row with zero advantage adds nothing to the policy loss, but does to these terms."""
        return self.beta_kl > 0 or self.entropy_coef > 0


def regularizers(
    logp: Tensor,
    mask: Tensor,
    settings: RegularizerSettings,
    ref_logp: Optional[Tensor] = None,
    entropy: Optional[Tensor] = None,
    num_seqs: Optional[float] = None,
    num_tokens: Optional[float] = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The KL and entropy terms to add to the policy loss, and their metrics.

    Args:
        logp: [B, T] log pi of the sampled tokens (requires grad).
        mask: [B, T] valid response tokens.
        settings: coefficients, estimator, aggregation.
        ref_logp: [B, T] log pi_ref, needed when ``beta_kl > 0``.
        entropy: [B, T] per-token entropy; with grad when ``entropy_coef > 0``; None: not logged.
        num_seqs, num_tokens: global counts for micro-batching (``aggregation.py``).

    Returns:
        term: [] float32 (0 when both coefficients are 0).
        metrics: detached "kl" (mean over valid tokens, the chosen estimator) when a reference is
            given, "entropy" (mean over valid tokens) when ``entropy`` is given.
    """
    if settings.beta_kl < 0 or settings.entropy_coef < 0:
        raise ValueError(f"beta_kl and entropy_coef must be >= 0, got {settings.beta_kl}, {settings.entropy_coef}")
    if settings.beta_kl > 0 and ref_logp is None:
        raise ValueError("beta_kl > 0 needs ref_logp ([B, T] reference log-probs)")
    if settings.entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs the per-token entropy")
    valid = mask != 0
    n_valid = valid.sum().clamp_min(1).float()
    term = torch.zeros((), dtype=torch.float32, device=logp.device)
    metrics: dict[str, Tensor] = {}
    if ref_logp is not None:
        # where(), not * mask: padding may hold -inf log-probs.
        kl = KL_ESTIMATORS.get(settings.kl_estimator)(torch.where(valid, logp.float(), 0.0),
                                                       torch.where(valid, ref_logp.float(), 0.0))
        if settings.beta_kl > 0:
            term = term + settings.beta_kl * aggregate(kl, mask, settings.agg_mode, num_seqs=num_seqs,
                                                       num_tokens=num_tokens)
        metrics["kl"] = (torch.where(valid, kl, 0.0).sum() / n_valid).detach()
    if entropy is not None:
        entropy = torch.where(valid, entropy.float(), 0.0)
        if settings.entropy_coef > 0:
            term = term - settings.entropy_coef * aggregate(entropy, mask, settings.agg_mode, num_seqs=num_seqs,
                                                            num_tokens=num_tokens)
        metrics["entropy"] = (entropy.sum() / n_valid).detach()
    return term, metrics
