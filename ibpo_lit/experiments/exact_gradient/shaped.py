"""The objective IBPO's shaping optimises, and its gradient, by enumeration.

Shaping replaces the reward ``r`` of a wrong rollout by ``r + lambda * Delta``, where
``Delta`` depends on the correction drawn for it (and on its group, through the partner).
With the correction process held fixed at the current weights (the estimator does not
differentiate through it), the shaped estimator's target is the gradient of

    J_shaped(theta) = (1/P) sum_x sum_y pi_theta(y | x) * (r(x, y) + lambda * Delta_bar(x, y)),

``Delta_bar(x, y) = E[Delta | x, y]`` over the partner (a right response with probability
``1 - (1 - p_x)^(G-1)``, the chance that one of the ``G - 1`` others is right, else a wrong
one) and over the corrector. This is the target up to one coupling term: the group's baseline holds the others' shaped
rewards, and a right ``y_i`` can be the partner that makes their corrections succeed, so
``E[r'_j grad log pi(y_i)] != 0`` for ``j != i``; it grows with lambda (the sweeps report
``cos(E g, grad J_shaped)`` of the ``none``-scaled estimator, the closest to this target).
``expected_delta`` estimates ``Delta_bar`` for every wrong
response by ``samples`` draws each (the only Monte-Carlo part; its error is ~1/sqrt(samples) of
Delta's spread), ``shaped_gradient`` differentiates ``J_shaped`` exactly.

Covered: ``plain`` and ``ratio`` (a reward change) with a fixed alpha. Not covered: ``mask``
(token weights are not a reward, so no such objective), an adaptive alpha (it depends on the
batch), and the joint training on corrections (the shaped objective describes the rollouts'
part of the estimator only). Group normalisation is not in ``J_shaped`` either: it reweights
prompts (by ``1 / std``), which biases GSPO's direction as much as IBPO's.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ibpo_lit.algorithms.registry import SHAPING_VARIANTS
from ibpo_lit.experiments.exact_gradient.corrector import (
    anchors,
    draw_corrections,
    partner_distribution_draws,
    rewrite_filter,
)
from ibpo_lit.experiments.exact_gradient.estimators import Method
from ibpo_lit.experiments.exact_gradient.policy import TinyPolicy, flat_grad, sequence_logp


@torch.no_grad()
def expected_delta(method: Method, policy: TinyPolicy, samples: int, generator: torch.Generator) -> Tensor:
    """[P, V^T] Delta_bar of every response (0 for right ones)."""
    if method.variant not in ("plain", "ratio") or method.alpha == "adaptive":
        raise ValueError(f"no shaped objective for variant {method.variant!r} with alpha {method.alpha!r}")
    pr = policy.problem
    table = policy.log_table()
    wrong = torch.nonzero(pr.all_rewards == 0)  # [N, 2] (prompt, sequence index)
    prompts = wrong[:, 0].repeat_interleave(samples)
    seqs = pr.all_sequences[wrong[:, 1]].repeat_interleave(samples, 0)
    partners = None
    if method.reference == "group":
        partners = partner_distribution_draws(pr, sequence_logp(pr, table), wrong[:, 0], method.group_size,
                                              samples, generator).reshape(-1, pr.length)
    anchor, rho = anchors(pr, method.corrector, prompts, seqs, partners)
    redraws = policy.log_table(marked=True) if method.corrector.marker else table  # the corrector's own view
    corrected = draw_corrections(pr, redraws, prompts, anchor, rho, generator)
    rewards = pr.reward(prompts, corrected)
    outcome = rewrite_filter(seqs, corrected, partners, rewards, method.alpha)
    kept_fraction = outcome.kept.double().mean(-1)
    value, _ = SHAPING_VARIANTS.get(method.variant)(method.beta, kept_fraction, None)
    value = torch.as_tensor(value, dtype=torch.float64).expand_as(rewards)
    delta = torch.where((rewards == 1) & ~outcome.rewrite, value, 0.0)
    out = torch.zeros_like(pr.all_rewards)
    out[wrong[:, 0], wrong[:, 1]] = delta.view(-1, samples).mean(-1)
    return out


def shaped_gradient(policy: TinyPolicy, lam: float, delta_bar: Tensor) -> Tensor:
    """[D] the exact gradient of J_shaped with ``Delta_bar`` [P, V^T] held fixed."""
    pr = policy.problem
    probs = sequence_logp(pr, policy.log_table()).exp()
    objective = (probs * (pr.all_rewards + lam * delta_bar)).sum(-1).mean()
    return flat_grad(objective, policy)
