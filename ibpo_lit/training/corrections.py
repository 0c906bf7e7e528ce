"""Compare-and-correct rollouts: IBPO's counterfactual signal (METHOD section 5).

For each wrong rollout ``y_i`` of a step, `Corrector` picks a reference ``y_ref`` from its group
(a correct rollout when there is one, another wrong one otherwise), asks the policy to compare
the two and correct, scores the correction with the same verifier and applies the full-rewrite
filter. `assemble_update` turns the outcome into shaped rewards (and, for ``variant: mask``,
token weights) and, with ``train_on_corrections``, also trains the correction samples.

All settings are ``model.algorithm.ibpo`` (`IBPOConfig`); what the corrector needs from the run
comes in a `CorrectionContext` (the tokenizer, the engine's ``generate``, the verifier, seeds,
sampling, the context limit), so it never reaches into the module. ``callbacks.CorrectionRollouts``
is the Lightning hook that calls it.

Covered: reference choice (or none: the k = 1 ablation below), the prompt
(``ibpo_lit.data.correction_prompt``), k corrections per correction prompt, fixed or adaptive
alpha, joint training with grouping by original prompt or by correction prompt, long correction
prompts truncated or skipped (counted in ``train/corrections_truncated`` /
``train/corrections_skipped_long``).
Not covered: source-side suppression (METHOD's optional penalty on full rewrites), and
unscorable rollouts (NaN reward) are neither corrected nor used as references.
Choices the paper left open: with ``corrections_per_input > 1`` the first correction of each
wrong rollout decides its shaping and all ``k`` are trained; with a reference, a rollout whose
group has no other scored rollout gets no correction.

Several processes: every seed and every reference draw is a function of the rollout's global
row (rank x rows per rank + row), so a run on N processes draws what one process drawing the
same global batch would; and ``generate`` and ``score`` are called on every rank, with no prompts
where a rank has no wrong rollout (a vLLM tensor-parallel group, an FSDP2-sharded HF engine and
a reward model or judge scoring in the trainer need every rank).

The k = 1 ablation (``reference: none``, "no counterfactual partner"): every wrong rollout gets a
self-revision prompt showing only itself, no reference is drawn, and the full-rewrite filter
keeps only ``d(y_i, y^) > alpha``: its second condition, ``d(y_i, y^) > d(y^, y_ref)``, compares
against a reference there is none of. Scoring, shaping and joint training are the same. Unlike
the paired mode, a wrong rollout with no other scored rollout in its group is corrected too.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ibpo_lit.algorithms.edit_alignment import (
    adaptive_alpha,
    is_full_rewrite,
    kept_positions,
    normalized_edit_distance,
)
from ibpo_lit.config import IBPOConfig
from ibpo_lit.data.correction_prompt import CorrectionPrompt
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.rollout.engine import SamplingConfig
from ibpo_lit.training.seeding import CORRECTIONS, REFERENCE_CHOICE, rollout_seeds
from ibpo_lit.training.step_types import Corrections, ScoredRollouts


@dataclass
class CorrectionContext:
    """What correcting a step needs from the run (built by the module for each step)."""

    tokenizer: object
    generate: Callable[..., RolloutBatch]  # the rollout engine's generate(prompt_ids, n, seeds, sampling)
    score: Callable[[list[str], list[Prompt]], Tensor]  # the verifier: NaN = unscorable
    seed: int  # the run's rollout seed
    rank: int  # this process's global rank
    sampling: SamplingConfig  # the rollouts' decoding settings
    context_limit: Optional[int] = None  # longest prompt + response (None: unknown)


def is_rewrite(original: Sequence[int], corrected: Sequence[int], reference: Optional[Sequence[int]], alpha: float) -> bool:
    """The full-rewrite filter of either mode: METHOD's two-sided test when there is a
    reference, only ``d(original, corrected) > alpha`` without one (k = 1)."""
    if reference is None:
        return normalized_edit_distance(original, corrected) > alpha
    return is_full_rewrite(original, corrected, reference, alpha)


class Corrector:
    """Makes a step's `Corrections` (see the module docstring)."""

    def __init__(self, cfg: IBPOConfig) -> None:
        self.cfg = cfg
        self.k = cfg.corrections_per_input
        self.prompt = CorrectionPrompt.from_config(cfg)

    def __call__(self, step: ScoredRollouts, ctx: CorrectionContext) -> Corrections:
        cfg, k = self.cfg, self.k
        rollouts, rewards = step.rollouts, step.rewards
        B, Lr = rollouts.response_ids.shape
        responses = rollouts.response_lists()
        groups = rollouts.group_index.tolist()

        pairs = self.correction_pairs(rewards.tolist(), groups, ctx.seed, step.step, rank=ctx.rank)
        out = Corrections(
            rewards=torch.full((B,), math.nan),
            rewrite=torch.zeros(B, dtype=torch.bool),
            kept_mask=torch.zeros(B, Lr, dtype=torch.bool),
            distance=torch.full((B,), math.nan),
            alpha=float(cfg.alpha) if cfg.alpha != "adaptive" else math.nan,
        )
        sampling = ctx.sampling
        if cfg.max_new_tokens is not None:
            sampling = replace(sampling, max_new_tokens=cfg.max_new_tokens)
        budget = ctx.context_limit - sampling.max_new_tokens if ctx.context_limit is not None else None
        prompt_ids, kept_pairs, truncated = [], [], 0
        for i, ref in pairs:
            ids, was_truncated = self.prompt.bounded_ids(
                ctx.tokenizer, step.prompts[groups[i]], step.texts[i], None if ref is None else step.texts[ref], budget
            )
            if ids is None:
                continue
            truncated += was_truncated
            prompt_ids.append(ids)
            kept_pairs.append((i, ref))
        long_metrics = {"train/corrections_truncated": float(truncated),
                        "train/corrections_skipped_long": float(len(pairs) - len(kept_pairs))}
        pairs = kept_pairs
        # Seeds of global row g's k corrections: g * k .. g * k + k - 1 of this step's stream.
        row_seeds = rollout_seeds(ctx.seed, step.step, CORRECTIONS, B * k, rank=ctx.rank)
        seeds = [row_seeds[i * k + j] for i, _ in pairs for j in range(k)]
        # Called on every rank, with no prompts where there is nothing to correct (a collective).
        batch = ctx.generate(prompt_ids, n=k, seeds=seeds, sampling=sampling)
        corrected = batch.response_lists()
        texts = ctx.tokenizer.batch_decode(corrected, skip_special_tokens=True) if corrected else []
        source = [pairs[m][0] for m in batch.group_index.tolist()]  # the wrong rollout each sample corrects
        # Scored on every rank too, with no texts where there are none: a reward model or a judge
        # scoring in the trainer is a collective under FSDP2 (ibpo_lit.model_rewards).
        scores = ctx.score(texts, [step.prompts[groups[i]] for i in source])
        if not pairs:
            out.metrics = {"train/corrections": 0.0, "train/rewrite_rate": 0.0, **long_metrics}
            return out

        # Shaping uses the first correction of each wrong rollout (row m * k).
        firsts = [m * k for m in range(len(pairs))]
        for m, row in enumerate(firsts):
            i, ref = pairs[m]
            out.rewards[i] = scores[row]
            out.distance[i] = normalized_edit_distance(responses[i], corrected[row])
            kept = kept_positions(responses[i], corrected[row])
            out.kept_mask[i, : len(kept)] = torch.tensor(kept, dtype=torch.bool)
        success = [m for m, row in enumerate(firsts) if scores[row] == 1]
        alpha = cfg.alpha
        if alpha == "adaptive":
            alpha = adaptive_alpha([float(out.distance[pairs[m][0]]) for m in success])
        out.alpha = float(alpha)
        for m in success:
            i, ref = pairs[m]
            out.rewrite[i] = is_rewrite(
                responses[i], corrected[firsts[m]], None if ref is None else responses[ref], float(alpha)
            )

        if cfg.train_on_corrections:
            if cfg.grouping == "prompt":
                train_groups = torch.tensor([groups[i] for i in source], dtype=torch.long)
            else:
                train_groups = batch.group_index.cpu()
            out.train_batch = replace(batch, group_index=train_groups.to(batch.group_index.device))
            out.train_rewards = scores
            out.train_source = torch.tensor(source, dtype=torch.long)
        out.generated_tokens = int(batch.response_mask.sum())
        out.prompt_tokens = int(batch.prompt_mask.sum())
        scored = scores[~scores.isnan()]
        out.metrics = {
            "train/corrections": float(len(texts)),
            "train/correction_success": float((scored == 1).float().mean()) if scored.numel() else math.nan,
            # share of successful corrections that are full rewrites; 0 when none succeeded
            "train/rewrite_rate": float(out.rewrite.sum()) / max(len(success), 1),
            "train/correction_alpha": out.alpha,
            "train/correction_distance": float(out.distance.nanmean()),
            **long_metrics,
        }
        return out

    def correction_pairs(
        self, rewards: list[float], groups: list[int], seed: int, step: int, rank: int = 0
    ) -> list[tuple[int, Optional[int]]]:
        """``(i, ref)`` for every wrong rollout ``i`` that gets a correction; with
        ``reference: none`` every wrong rollout, paired with None (no reference is drawn)."""
        if self.cfg.reference == "none":
            return [(i, None) for i, reward in enumerate(rewards) if reward == 0]  # NaN is not wrong
        return choose_references(rewards, groups, seed, step, rank=rank)


def choose_references(
    rewards: list[float], groups: list[int], seed: int, step: int, rank: int = 0
) -> list[tuple[int, int]]:
    """``(i, ref)`` for every wrong rollout ``i`` that has a partner (METHOD section 5, step 1):
    ``ref`` uniform over the group's correct rollouts, else over its other wrong ones. Row
    ``i``'s draw has its own seed, from its global row (``rank * len(rewards) + i``)."""
    row_seeds = rollout_seeds(seed, step, REFERENCE_CHOICE, len(rewards), rank=rank)
    members: dict[int, list[int]] = {}
    for row, g in enumerate(groups):
        members.setdefault(g, []).append(row)
    pairs = []
    for i, (reward, g) in enumerate(zip(rewards, groups)):
        if reward != 0:  # correct, or NaN (unscorable)
            continue
        correct = [j for j in members[g] if rewards[j] == 1]
        wrong = [j for j in members[g] if rewards[j] == 0 and j != i]
        candidates = correct or wrong
        if candidates:
            pairs.append((i, random.Random(row_seeds[i]).choice(candidates)))
    return pairs
