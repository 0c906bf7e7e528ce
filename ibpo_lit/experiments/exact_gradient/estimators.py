"""The methods, and one draw of each one's policy-gradient estimate.

A ``Method`` names a configuration of the real step: the loss (``POLICY_LOSSES``), the
advantage scale, IBPO's shaping (variant, lambda, beta, alpha, joint training, reference, k)
and CIW. ``draw_loss`` runs one step's estimator on the testbed, at the on-policy point
(``old_logp = logp.detach()``, every ratio 1), composing the project's functions as
``ibpo_lit/training/assemble.py`` does (tests/experiments/test_exact_gradient.py checks the
advantages and token weights against ``assemble_update`` itself):

1. ``G`` rollouts per prompt from the policy; rewards from the verifier;
2. IBPO: a partner per wrong rollout (``corrector.choose_references``), ``k`` corrections
   each, the first one's reward, distance, kept positions and rewrite verdict
   (``edit_alignment``), then ``shape_rewards`` (``r' = r + lambda * Delta``; token weights
   for ``mask``);
3. ``grouped_advantages`` of the (shaped) rewards per prompt; with joint training the
   correction samples are appended, their groups numbered after the prompts'
   (``grouping: prompt``: one group per original prompt; ``input``: per correction prompt),
   their advantages from their own 0/1 rewards, their token weights 1;
4. CIW (GSPO-token weights): the answer region is the last token, each earlier token a span;
   a span's drop is ``log pi(answer | y) - log pi(answer | y with the span masked)``;
   ``importance_from_drops`` and ``ciw_token_weights`` with ``CIWConfig``'s defaults;
5. the loss, ``POLICY_LOSSES[loss](LossInputs(...), LossSettings(...))`` with the batch's
   global ``num_seqs`` / ``num_tokens``; rows whose advantage is 0 are left out of the forward
   (as ``training/update.py`` leaves them out) and kept in the denominators.

The estimate of ``grad J`` is ``-grad loss``. The cost of a draw is counted in generated
sequences (rollouts + corrections; every sequence has T tokens) and in context tokens
(prompt + response: a rollout's prompt is 1 token, a correction's ``1 + 2T`` with a partner,
``1 + T`` without).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Optional

import torch
from torch import Tensor

from ibpo_lit.algorithms.advantages import grouped_advantages
from ibpo_lit.algorithms.ciw import CIWConfig, ciw_token_weights, importance_from_drops
from ibpo_lit.algorithms.diagnostics import reward_shaping_covariance
from ibpo_lit.algorithms.registry import POLICY_LOSSES, LossInputs, LossSettings
from ibpo_lit.algorithms.shaping import shape_rewards, validate_shaping
from ibpo_lit.experiments.exact_gradient.corrector import (
    CorrectorSpec,
    anchors,
    choose_references,
    correction_logp,
    draw_corrections,
    rewrite_filter,
)
from ibpo_lit.experiments.exact_gradient.policy import TinyPolicy, sample
from ibpo_lit.experiments.exact_gradient.problem import Problem

CLIP = {"gspo": (3e-4, 4e-4), "grpo": (0.2, 0.2)}  # the config defaults of each loss


@dataclass(frozen=True)
class Method:
    """One estimator: the real step's settings that matter on the testbed.

    Args:
        name: a label for tables.
        loss: a name in ``POLICY_LOSSES`` (``gspo``, ``grpo``).
        group_size: G, rollouts per prompt.
        advantage_scale: a name in ``ADVANTAGE_SCALES``.
        agg_mode: GRPO's aggregation (None: its default, ``seq-mean-token-mean``).
        variant: IBPO shaping (``none`` = no corrections at all, ``plain``, ``ratio``, ``mask``).
        lam, beta, alpha: IBPO's lambda, beta and rewrite threshold (a number or ``adaptive``).
        train_on_corrections: train the correction samples jointly (off: "shaping only").
        reference: ``group`` (a partner from the group) or ``none`` (k = 1: no partner).
        corrections_per_input: k samples per correction prompt (the first decides shaping).
        grouping: correction samples' advantage groups, ``prompt`` or ``input``.
        corrector: how corrections are made (``corrector.CorrectorSpec``).
        ciw: CIW token weights (GSPO-token); None = off.
    """

    name: str
    loss: str = "gspo"
    group_size: int = 8
    advantage_scale: str = "group"
    agg_mode: Optional[str] = None
    variant: str = "none"
    lam: float = 0.6
    beta: float = 0.5
    alpha: float | str = 0.6
    train_on_corrections: bool = True
    reference: str = "group"
    corrections_per_input: int = 1
    grouping: str = "prompt"
    corrector: CorrectorSpec = field(default_factory=CorrectorSpec)
    ciw: Optional[CIWConfig] = None

    def __post_init__(self) -> None:
        POLICY_LOSSES.get(self.loss)
        validate_shaping(self.variant, self.lam, self.beta)
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2, got {self.group_size}")
        if self.reference not in ("group", "none"):
            raise ValueError(f"reference must be 'group' or 'none', got {self.reference!r}")
        if self.grouping not in ("prompt", "input") or (self.grouping == "input" and self.corrections_per_input < 2):
            raise ValueError("grouping must be 'prompt', or 'input' with corrections_per_input >= 2")

    @property
    def corrects(self) -> bool:
        return self.variant != "none"

    def settings(self) -> LossSettings:
        eps_low, eps_high = CLIP.get(self.loss, (0.2, 0.2))
        return LossSettings(eps_low, eps_high, self.agg_mode)

    def with_(self, **changes) -> "Method":
        return replace(self, **changes)


@dataclass
class DrawInfo:
    """What one draw generated and how its corrections went."""

    sequences: int  # generated: rollouts + corrections
    context_tokens: int  # prompt + response tokens of every generated sequence
    corrections: int = 0
    successes: int = 0  # corrections the verifier accepted (first of each wrong rollout)
    shaped: int = 0  # rollouts with Delta > 0
    rewrites: int = 0
    reward_mean: float = 0.0
    cov_y_phi: float = float("nan")  # Assumption A.1's Cov(Y, phi) (NaN without IBPO)


@dataclass
class Composed:
    """The batch a draw trains on, before any forward pass (what ``assemble_update`` builds)."""

    prompts: Tensor  # [N] long, each row's prompt
    seqs: Tensor  # [N, T] long
    advantages: Tensor  # [N]
    token_weights: Optional[Tensor]  # [N, T] or None
    num_rollouts: int  # B: rows 0..B-1 are rollouts, the rest correction samples
    anchor: Optional[Tensor] = None  # [C, T] the correction rows' q parameters
    rho: Optional[Tensor] = None
    shaped_rewards: Optional[Tensor] = None  # [B]
    delta: Optional[Tensor] = None  # [B]
    corrections: Optional[dict] = None  # the corrections' outcomes (``_corrections``'s keys)


def compose(method: Method, problem: Problem, table: Tensor, rollout_gen: torch.Generator,
            correction_gen: torch.Generator, policy: Optional[TinyPolicy] = None,
            correction_table: Optional[Tensor] = None) -> tuple[Composed, DrawInfo]:
    """Steps 1-4 of the module docstring (``policy`` is needed for CIW's masked forwards;
    ``correction_table``: the policy's table under the correction marker, default ``table``)."""
    g, t = method.group_size, problem.length
    prompts = torch.arange(problem.num_prompts).repeat_interleave(g)
    seqs = sample(problem, table, prompts, rollout_gen)
    rewards = problem.reward(prompts, seqs)
    b = len(prompts)
    info = DrawInfo(sequences=b, context_tokens=b * (1 + t), reward_mean=float(rewards.mean()))
    shaped, token_weights, delta = rewards, None, torch.zeros_like(rewards)
    extra = None
    if method.corrects:
        rng = random.Random(int(torch.randint(2 ** 62, (1,), generator=correction_gen)))
        pairs = choose_references(rewards.tolist(), prompts.tolist(), rng, with_partner=method.reference == "group")
        extra = _corrections(method, problem, table if correction_table is None else correction_table, prompts, seqs,
                             rewards, pairs, correction_gen, info)
        result = shape_rewards(rewards, extra["shaping_rewards"], extra["rewrite"], extra["kept"],
                               torch.ones(b, t, dtype=torch.bool), variant=method.variant, lam=method.lam,
                               beta=method.beta)
        shaped, token_weights, delta = result.shaped_rewards, result.token_weights, result.delta
        info.shaped = int((delta > 0).sum())
        info.cov_y_phi = reward_shaping_covariance(rewards, delta)
    advantages = grouped_advantages(shaped, prompts, scale=method.advantage_scale)
    composed = Composed(prompts, seqs, advantages, token_weights, b, shaped_rewards=shaped, delta=delta,
                        corrections=extra)
    if extra is not None and method.train_on_corrections and len(extra["prompts"]):
        offset = int(prompts.max()) + 1  # correction groups after the prompts' (assemble.py)
        groups = extra["prompts"] if method.grouping == "prompt" else extra["input"]
        extra_adv = grouped_advantages(extra["rewards"], groups + offset, scale=method.advantage_scale)
        composed.prompts = torch.cat([prompts, extra["prompts"]])
        composed.seqs = torch.cat([seqs, extra["seqs"]])
        composed.advantages = torch.cat([advantages, extra_adv])
        composed.anchor, composed.rho = extra["anchor"], extra["rho"]
        if token_weights is not None:
            composed.token_weights = torch.cat([token_weights, torch.ones(len(extra["prompts"]), t)])
    if method.ciw is not None:
        weights = ciw_weights(method.ciw, problem, policy, composed.prompts, composed.seqs)
        composed.token_weights = weights if composed.token_weights is None else composed.token_weights * weights
    return composed, info


def _corrections(method, problem, table, prompts, seqs, rewards, pairs, gen, info) -> dict:
    """Draw ``k`` corrections per pair; the first of each decides the shaping inputs."""
    b, t, k = len(prompts), problem.length, method.corrections_per_input
    out = {"shaping_rewards": torch.full((b,), float("nan"), dtype=torch.float64),
           "rewrite": torch.zeros(b, dtype=torch.bool), "kept": torch.zeros(b, t, dtype=torch.bool)}
    if not pairs:
        out.update(prompts=torch.zeros(0, dtype=torch.long), seqs=torch.zeros(0, t, dtype=torch.long),
                   rewards=torch.zeros(0, dtype=torch.float64), input=torch.zeros(0, dtype=torch.long),
                   anchor=torch.zeros(0, t, dtype=torch.long), rho=torch.zeros(0, t, dtype=torch.float64),
                   source=torch.zeros(0, dtype=torch.long))
        return out
    source = torch.tensor([i for i, _ in pairs for _ in range(k)])
    has_partner = pairs[0][1] is not None
    partners = seqs[torch.tensor([r for _, r in pairs for _ in range(k)])] if has_partner else None
    c_prompts = prompts[source]
    anchor, rho = anchors(problem, method.corrector, c_prompts, seqs[source], partners)
    corrected = draw_corrections(problem, table, c_prompts, anchor, rho, gen)
    c_rewards = problem.reward(c_prompts, corrected)
    first = torch.arange(0, len(source), k)
    outcome = rewrite_filter(seqs[source[first]], corrected[first], None if partners is None else partners[first],
                             c_rewards[first], method.alpha)
    rows = source[first]
    out["shaping_rewards"][rows] = c_rewards[first]
    out["rewrite"][rows] = outcome.rewrite
    out["kept"][rows] = outcome.kept
    out.update(prompts=c_prompts, seqs=corrected, rewards=c_rewards, anchor=anchor, rho=rho, source=source,
               input=torch.arange(len(pairs)).repeat_interleave(k))
    info.corrections = len(source)
    info.successes = int((c_rewards[first] == 1).sum())
    info.rewrites = int(outcome.rewrite.sum())
    info.sequences += len(source)
    info.context_tokens += len(source) * (1 + (2 * t if has_partner else t) + t)
    return out


@torch.no_grad()
def ciw_weights(cfg: CIWConfig, problem: Problem, policy: TinyPolicy, prompts: Tensor, seqs: Tensor) -> Tensor:
    """[N, T] CIW token weights: answer = the last token, spans = the earlier tokens (one each,
    or ``max_spans`` contiguous runs when there are more)."""
    n, t = seqs.shape
    reasoning_len = t - 1
    bounds = torch.linspace(0, reasoning_len, min(cfg.max_spans, reasoning_len) + 1).round().long().tolist()
    spans = [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
    full = policy.token_logp(prompts, seqs)[:, -1]  # [N] log pi(answer | y)
    masks = torch.zeros(len(spans), t, dtype=torch.bool)
    for s, (lo, hi) in enumerate(spans):
        masks[s, lo:hi] = True
    rep = masks.repeat(n, 1)  # [N * spans, T]
    masked = policy.token_logp(prompts.repeat_interleave(len(spans)), seqs.repeat_interleave(len(spans), 0), rep)
    drops = (full.repeat_interleave(len(spans)) - masked[:, -1]).view(n, len(spans))
    importance = torch.zeros(n, t)
    for row in range(n):
        importance[row, :reasoning_len] = importance_from_drops(reasoning_len, spans, drops[row].tolist(), cfg)
    reasoning = torch.zeros(n, t, dtype=torch.bool)
    reasoning[:, :reasoning_len] = True
    answer = ~reasoning
    return ciw_token_weights(importance, reasoning, answer, torch.zeros_like(reasoning), cfg).double()


def draw_loss(method: Method, policy: TinyPolicy, table: Tensor, rollout_gen: torch.Generator,
              correction_gen: torch.Generator) -> tuple[Tensor, DrawInfo, Composed]:
    """One step's loss (a function of the policy's weights) and what the draw cost."""
    marked = method.corrector.marker and method.corrects
    if marked and not policy.marker:
        raise ValueError(f"{method.name}: a marker corrector needs a TinyPolicy built with marker=True")
    correction_table = policy.log_table(marked=True).detach() if marked else None
    composed, info = compose(method, policy.problem, table, rollout_gen, correction_gen, policy, correction_table)
    n, t = composed.seqs.shape
    active = torch.nonzero(composed.advantages != 0).squeeze(-1)
    corr = active >= composed.num_rollouts
    if marked:  # correction rows under the marker, rollouts without (rollouts first in ``active``)
        logp = torch.cat([policy.token_logp(composed.prompts[active[~corr]], composed.seqs[active[~corr]]),
                          policy.token_logp(composed.prompts[active[corr]], composed.seqs[active[corr]], marked=True)])
    else:
        logp = policy.token_logp(composed.prompts[active], composed.seqs[active])
    if corr.any():
        c = active[corr] - composed.num_rollouts
        logq = correction_logp(logp[corr], composed.seqs[active[corr]], composed.anchor[c], composed.rho[c])
        logp = torch.cat([logp[~corr], logq])  # active is sorted: rollouts first, then corrections
    weights = composed.token_weights[active] if composed.token_weights is not None else None
    inputs = LossInputs(logp, logp.detach(), composed.advantages[active], torch.ones_like(logp, dtype=torch.bool),
                        token_weights=weights, num_seqs=float(n), num_tokens=float(n * t))
    loss, _ = POLICY_LOSSES.get(method.loss)(inputs, method.settings())
    return loss, info, composed
