"""Compare-and-correct, modelled on the testbed's policy (METHOD section 5, steps 1-3).

A wrong rollout ``y`` (of prompt ``x``) is corrected given a partner ``y_ref`` drawn from its
group as ``training/corrections.py`` draws it (uniform over the group's right rollouts, else
over its other wrong ones; no partner with ``reference: none``, the k = 1 ablation). The
correction ``y^`` is drawn position by position from

    q(v | t, y^_<t) = (1 - rho_t) * 1[v = a_t] + rho_t * pi_theta(v | x, y^_<t),

an *anchor* token ``a_t`` kept with probability ``1 - rho_t``, else a token the policy redraws
(with the corrected prefix). Which anchor, and how often the policy redraws, is the
corrector's kind (``CorrectorSpec``):

- ``informative``: the *fixable errors* are the positions where ``y`` is wrong and the partner
  right; there ``a_t = y_ref,t`` and ``rho_t = 1 - skill`` (the partner's token is copied with
  probability ``skill``); elsewhere ``a_t = y_t`` and ``rho_t = locality`` (0: a purely local
  edit; larger: more of the rest is rewritten). With a right partner, ``skill = 1`` and
  ``locality = 0`` every correction is right; with a wrong partner only the errors it does not
  share are fixed. This is the "compare, find the inconsistency, fix it" of the template: the
  comparison says *where* and *how*.
- ``uninformative``: the partner is ignored (as it is absent with ``reference: none``):
  ``a_t = y_t`` and ``rho_t = skill`` everywhere, a revision that redraws a random share of
  the response; ``skill = 1`` is a fresh answer that ignores ``y`` as well.

``q`` is a function of ``theta`` through ``pi_theta``, so the correction samples have exact
per-token log-probs (``correction_logp``) and a gradient when they are trained jointly: the
policy's own correction behaviour, conditioned on the correction prompt through ``(a, rho)``.
The realised success rate (the share of corrections the verifier accepts) is measured, not
set: it grows with ``skill``, with a right partner, and as the policy improves.

``marker``: the corrections are drawn, and trained, under the correction marker (a policy built
with ``marker=True``; ``policy.py``): ``pi_theta(v | x, y^_<t, marker)`` in ``q``, an input the
policy's own rollouts never carry. Without it the redraws are the rollouts' own conditionals and
whatever training on corrections teaches the policy holds on the original prompts for free (the
most favourable case for joint training); with it, it must cross from the marked input to the
unmarked one through the shared weights.

Rewrite filter and kept positions: the project's ``edit_alignment`` functions, with the
one-sided test without a partner (``training/corrections.py``'s ``is_rewrite``).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ibpo_lit.algorithms.edit_alignment import (
    adaptive_alpha,
    is_full_rewrite,
    kept_positions,
    normalized_edit_distance,
)
from ibpo_lit.experiments.exact_gradient.problem import Problem

KINDS = ("informative", "uninformative")


@dataclass(frozen=True)
class CorrectorSpec:
    """How corrections are made.

    Args:
        kind: ``informative`` (uses the partner) or ``uninformative`` (ignores it).
        skill: informative: probability of copying the partner's token at a fixable error;
            uninformative: probability of redrawing each token.
        locality: informative: probability of redrawing each token that is not a fixable error.
        marker: the policy's redraws (and the correction samples' training) see the correction
            marker, an input feature rollouts never carry (needs a ``TinyPolicy(marker=True)``).
    """

    kind: str = "informative"
    skill: float = 1.0
    locality: float = 0.0
    marker: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"corrector kind must be one of {KINDS}, got {self.kind!r}")
        for name in ("skill", "locality"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"corrector {name} must be in [0, 1], got {getattr(self, name)}")


def choose_references(rewards: list[float], groups: list[int], rng: random.Random,
                      with_partner: bool = True) -> list[tuple[int, Optional[int]]]:
    """``(i, ref)`` for every wrong row ``i``: ``ref`` uniform over its group's right rows, else
    over its other wrong rows (rows without either get no correction); ``ref = None`` for
    every wrong row when ``with_partner`` is False (``reference: none``)."""
    if not with_partner:
        return [(i, None) for i, r in enumerate(rewards) if r == 0]
    members: dict[int, list[int]] = {}
    for row, g in enumerate(groups):
        members.setdefault(g, []).append(row)
    pairs = []
    for i, (r, g) in enumerate(zip(rewards, groups)):
        if r != 0:
            continue
        right = [j for j in members[g] if rewards[j] == 1]
        wrong = [j for j in members[g] if rewards[j] == 0 and j != i]
        candidates = right or wrong
        if candidates:
            pairs.append((i, rng.choice(candidates)))
    return pairs


def anchors(problem: Problem, spec: CorrectorSpec, prompts: Tensor, seqs: Tensor,
            partners: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``(a, rho)`` [C, T]: the anchor tokens and redraw probabilities of C corrections."""
    if spec.kind == "uninformative" or partners is None:
        rate = spec.skill if spec.kind == "uninformative" else spec.locality
        return seqs.clone(), torch.full(seqs.shape, float(rate), dtype=torch.float64)
    fixable = problem.errors(prompts, seqs) & ~problem.errors(prompts, partners)
    anchor = torch.where(fixable, partners, seqs)
    rho = torch.where(fixable, 1.0 - spec.skill, spec.locality).to(torch.float64)
    return anchor, rho


@torch.no_grad()
def draw_corrections(problem: Problem, table: Tensor, prompts: Tensor, anchor: Tensor, rho: Tensor,
                     generator: torch.Generator) -> Tensor:
    """[C, T] corrections drawn from ``q`` (the policy's redraws read from ``table`` [P, S, V])."""
    c = prompts.shape[0]
    out = torch.empty_like(anchor)
    code = torch.zeros(c, dtype=torch.long)
    for t in range(problem.length):
        probs = table[prompts, problem.offsets[t] + code].exp()
        redrawn = torch.multinomial(probs, 1, generator=generator).squeeze(-1) if c else anchor[:, t]
        redraw = torch.rand(c, generator=generator, dtype=torch.float64) < rho[:, t]
        out[:, t] = torch.where(redraw, redrawn, anchor[:, t])
        code = code * problem.vocab + out[:, t]
    return out


def correction_logp(policy_logp: Tensor, corrected: Tensor, anchor: Tensor, rho: Tensor) -> Tensor:
    """[C, T] ``log q(y^_t | ...)`` from the policy's ``log pi(y^_t | x, y^_<t)`` [C, T]
    (differentiable through it): ``log((1 - rho) 1[y^_t = a_t] + rho pi)``."""
    keep = (1.0 - rho) * (corrected == anchor).to(rho.dtype)
    return torch.log(keep + rho * policy_logp.exp())


def is_rewrite(original, corrected, reference, alpha: float) -> bool:
    """The full-rewrite filter: two-sided with a partner, ``d(y, y^) > alpha`` without one."""
    if reference is None:
        return normalized_edit_distance(original, corrected) > alpha
    return is_full_rewrite(original, corrected, reference, alpha)


@dataclass
class FilterOutcome:
    """The rewrite filter's verdicts on C corrections (the first of each wrong rollout)."""

    distance: Tensor  # [C] d(y, y^)
    kept: Tensor  # [C, T] bool, positions of y the alignment keeps
    rewrite: Tensor  # [C] bool, computed for the right corrections only (False elsewhere)
    alpha: float


def rewrite_filter(originals: Tensor, corrected: Tensor, partners: Optional[Tensor], rewards: Tensor,
                   alpha: float | str) -> FilterOutcome:
    """Distances, kept positions and rewrite verdicts, as ``training/corrections.py`` computes
    them: alpha ``adaptive`` is ``mean + 2 std`` of the right corrections' distances."""
    orig, corr = originals.tolist(), corrected.tolist()
    refs = partners.tolist() if partners is not None else [None] * len(orig)
    distance = torch.tensor([normalized_edit_distance(a, b) for a, b in zip(orig, corr)], dtype=torch.float64)
    kept = torch.tensor([kept_positions(a, b) for a, b in zip(orig, corr)], dtype=torch.bool).reshape(originals.shape)
    right = [m for m in range(len(orig)) if rewards[m] == 1]
    if alpha == "adaptive":
        alpha = adaptive_alpha([float(distance[m]) for m in right])
    rewrite = torch.zeros(len(orig), dtype=torch.bool)
    for m in right:
        rewrite[m] = is_rewrite(orig[m], corr[m], refs[m], float(alpha))
    return FilterOutcome(distance, kept, rewrite, float(alpha))


def partner_distribution_draws(problem: Problem, table_seq_logp: Tensor, wrong_prompts: Tensor, group_size: int,
                               k: int, generator: torch.Generator) -> Tensor:
    """[N, k, T] partners for N wrong rollouts of ``wrong_prompts`` [N], drawn as a group of
    ``group_size`` would supply them: a right response (from pi given right) with probability
    ``1 - (1 - p_x)^(G-1)``, else a wrong one (from pi given wrong). ``table_seq_logp`` [P, V^T]."""
    probs = table_seq_logp.exp()
    right = problem.all_rewards
    p = (probs * right).sum(-1)  # [P]
    seqs = problem.all_sequences
    n = wrong_prompts.shape[0]
    has_right = 1.0 - (1.0 - p) ** (group_size - 1)
    use_right = torch.rand(n, k, generator=generator, dtype=torch.float64) < has_right[wrong_prompts][:, None]
    right_w = (probs * right)[wrong_prompts]  # [N, V^T]
    wrong_w = (probs * (1 - right))[wrong_prompts]
    right_w = torch.where(right_w.sum(-1, keepdim=True) > 0, right_w, wrong_w)  # no right response at all
    pick_right = torch.multinomial(right_w, k, replacement=True, generator=generator)
    pick_wrong = torch.multinomial(wrong_w, k, replacement=True, generator=generator)
    return seqs[torch.where(use_right, pick_right, pick_wrong)]


def nan_rate(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
