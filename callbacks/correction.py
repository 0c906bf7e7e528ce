"""Compare-and-correct rollouts: IBPO's counterfactual signal (METHOD section 5).

For each wrong rollout ``y_i`` of a step the callback picks a reference ``y_ref`` from its
group (a correct rollout when there is one, another wrong one otherwise), asks the policy
to compare the two and correct, scores the correction with the same verifier and applies
the full-rewrite filter. The module turns the outcome into shaped rewards (and, for
``ibpo: mask``, token weights) and, when ``train_on_corrections`` is on, also trains the
correction samples with the same loss.

Covered: reference choice (or none: the k = 1 ablation below), the prompt template (its
wording is configurable), k corrections per correction prompt, fixed or adaptive alpha, joint
training with grouping by original prompt or by correction prompt.
Not covered: source-side suppression (METHOD's optional penalty on full rewrites), and
unscorable rollouts (NaN reward) are neither corrected nor used as references.
Choices the paper left open: with ``corrections_per_input > 1`` the first correction of each
wrong rollout decides its shaping and all ``k`` are trained; with a reference, a rollout whose
group has no other scored rollout gets no correction.

Long inputs: a correction prompt holds the problem and two whole responses, so with long
responses it can exceed the context (``pl_module.context_limit``: the model's positions, or
``rollout.vllm.max_model_len``). ``on_long_prompt`` decides: ``truncate`` (default) shortens
each candidate in its middle, keeping its opening and its end (where the final answer is) with
a ``[... N tokens omitted ...]`` marker; ``skip`` gives that wrong rollout no correction. Both
are counted in ``train/corrections_truncated`` / ``train/corrections_skipped_long``.

Several processes: every seed and every reference draw is a function of the rollout's global
row (rank x rows per rank + row), so a run on N processes draws what one process drawing the
same global batch would; and ``generate`` is called on every rank, with no prompts where a rank
has no wrong rollout (a vLLM tensor-parallel group or an FSDP2-sharded HF engine needs every rank).

The k = 1 ablation (``reference: none``, "no counterfactual partner"): every wrong rollout
gets a self-revision prompt showing only itself, no reference is drawn, and the full-rewrite
filter keeps only ``d(y_i, y^) > alpha``: its second condition, ``d(y_i, y^) > d(y^, y_ref)``,
compares against a reference there is none of. Scoring, shaping and joint training are the
same. Unlike the paired mode, a wrong rollout with no other scored rollout in its group is
corrected too (it needs no partner).

This is a Lightning callback that acts through one extra hook, ``on_rollouts_scored``, which
``IBPOModule.training_step`` calls on every callback that defines it.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Literal, Optional, Sequence, Union

import torch
from lightning.pytorch.callbacks import Callback

from ibpo_lit.algorithms.edit_alignment import adaptive_alpha, is_full_rewrite, kept_positions, normalized_edit_distance
from ibpo_lit.seeding import CORRECTIONS, REFERENCE_CHOICE, rollout_seeds
from ibpo_lit.step import Corrections, ScoredRollouts

DEFAULT_TEMPLATE = (
    "You are given two candidate solutions to the same problem. Compare them step by step, "
    "identify any inconsistencies or errors, and then produce a corrected solution and final answer."
)
DEFAULT_ANSWER_INSTRUCTION = "End with the final answer in the format the problem asks for."
# Code prompts (``Prompt.task == "code"``): the same comparison, with both candidates shown as
# code blocks (extracted from the responses) and the correction asked for as one.
DEFAULT_CODE_TEMPLATE = (
    "You are given two candidate Python solutions to the same programming problem. Compare them step "
    "by step, identify any bugs or inconsistencies, and then write a corrected solution in a single "
    "```python code block."
)
# ``reference: none`` (k = 1): the same wording, adapted to a single candidate.
DEFAULT_SELF_REVISION_TEMPLATE = (
    "You are given a candidate solution to a problem. Check it step by step, identify any errors, "
    "and then produce a corrected solution and final answer."
)
DEFAULT_SELF_REVISION_CODE_TEMPLATE = (
    "You are given a candidate Python solution to a programming problem. Check it step by step, "
    "identify any bugs, and then write a corrected solution in a single ```python code block."
)
REFERENCE_MODES = ("group", "none")


def is_rewrite(original: Sequence[int], corrected: Sequence[int], reference: Optional[Sequence[int]], alpha: float) -> bool:
    """The full-rewrite filter of either mode: METHOD's two-sided test when there is a
    reference, only ``d(original, corrected) > alpha`` without one (k = 1)."""
    if reference is None:
        return normalized_edit_distance(original, corrected) > alpha
    return is_full_rewrite(original, corrected, reference, alpha)


class CorrectionRollouts(Callback):
    """Generates IBPO's compare-and-correct rollouts for every wrong rollout.

    Args:
        alpha: Full-rewrite threshold on the normalised token edit distance ``d(y_i, y^)``,
            a number in [0, 1] (paper: 0.6, stable from 0.55 to 0.70), or ``adaptive``
            (mean + 2 std of ``d`` over the step's successful corrections).
        corrections_per_input: Corrections sampled per correction prompt (k).
        train_on_corrections: Train the correction samples jointly with the same loss (the
            paper's default; off = its "shaping only" ablation).
        grouping: How correction samples are grouped for their advantages: ``prompt`` (all
            corrections of one original prompt) or ``input`` (the k samples of one
            correction prompt; needs ``corrections_per_input >= 2``).
        max_new_tokens: Longest correction; unset = the rollouts' ``max_new_tokens``.
        template: Instruction that opens the correction prompt.
        code_template: The same for code tasks (``Prompt.task == "code"``), whose candidates
            are shown as ```python blocks.
        answer_instruction: How the correction must state its answer; unset = the prompt's
            own instruction (``Prompt.meta["instruction"]``) or a generic one.
        reference: ``group`` (the paper's method: a partner drawn from the group) or ``none``
            (the k = 1 ablation: the policy revises its wrong answer alone; the rewrite filter
            keeps only ``d(y_i, y^) > alpha``).
        self_revision_template: Instruction of the prompt with ``reference: none``.
        self_revision_code_template: The same for code tasks.
        on_long_prompt: A correction prompt that leaves no room for ``max_new_tokens`` in the
            context: ``truncate`` the candidates in their middle, or ``skip`` the correction.
    """

    def __init__(
        self,
        alpha: Union[float, Literal["adaptive"]] = 0.6,
        corrections_per_input: int = 1,
        train_on_corrections: bool = True,
        grouping: Literal["prompt", "input"] = "prompt",
        max_new_tokens: Optional[int] = None,
        template: str = DEFAULT_TEMPLATE,
        code_template: str = DEFAULT_CODE_TEMPLATE,
        answer_instruction: Optional[str] = None,
        reference: Literal["group", "none"] = "group",
        self_revision_template: str = DEFAULT_SELF_REVISION_TEMPLATE,
        self_revision_code_template: str = DEFAULT_SELF_REVISION_CODE_TEMPLATE,
        on_long_prompt: Literal["truncate", "skip"] = "truncate",
    ) -> None:
        if on_long_prompt not in ("truncate", "skip"):
            raise ValueError(f"CorrectionRollouts.on_long_prompt must be 'truncate' or 'skip', got {on_long_prompt!r}")
        if reference not in REFERENCE_MODES:
            raise ValueError(f"CorrectionRollouts.reference must be one of {', '.join(REFERENCE_MODES)}; got {reference!r}")
        if alpha != "adaptive" and not (isinstance(alpha, (int, float)) and 0 <= alpha <= 1):
            raise ValueError(f"CorrectionRollouts.alpha must be a number in [0, 1] or 'adaptive', got {alpha!r}")
        if corrections_per_input < 1:
            raise ValueError(f"CorrectionRollouts.corrections_per_input must be >= 1, got {corrections_per_input}")
        if grouping == "input" and corrections_per_input < 2:
            raise ValueError(
                "CorrectionRollouts.grouping='input' needs corrections_per_input >= 2: a group of one "
                "correction has no advantage signal."
            )
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"CorrectionRollouts.max_new_tokens must be >= 1, got {max_new_tokens}")
        self.alpha = alpha
        self.k = corrections_per_input
        self.train_on_corrections = train_on_corrections
        self.grouping = grouping
        self.max_new_tokens = max_new_tokens
        self.template = template
        self.code_template = code_template
        self.answer_instruction = answer_instruction
        self.reference = reference
        self.self_revision_template = self_revision_template
        self.self_revision_code_template = self_revision_code_template
        self.on_long_prompt = on_long_prompt

    # ------------------------------------------------------------------ hook
    def on_rollouts_scored(self, trainer, pl_module, step: ScoredRollouts) -> None:
        rollouts, rewards = step.rollouts, step.rewards
        B, Lr = rollouts.response_ids.shape
        responses = rollouts.response_lists()
        groups = rollouts.group_index.tolist()
        rank, seed = pl_module.global_rank, pl_module.rollout_cfg.seed

        pairs = self.correction_pairs(rewards.tolist(), groups, seed, step.step, rank=rank)
        out = Corrections(
            rewards=torch.full((B,), math.nan),
            rewrite=torch.zeros(B, dtype=torch.bool),
            kept_mask=torch.zeros(B, Lr, dtype=torch.bool),
            distance=torch.full((B,), math.nan),
            alpha=float(self.alpha) if self.alpha != "adaptive" else math.nan,
        )
        tokenizer = pl_module.tokenizer
        sampling = pl_module.rollout_cfg.sampling
        if self.max_new_tokens is not None:
            sampling = replace(sampling, max_new_tokens=self.max_new_tokens)
        budget = getattr(pl_module, "context_limit", None)
        budget = budget - sampling.max_new_tokens if budget is not None else None
        prompt_ids, kept_pairs, truncated = [], [], 0
        for i, ref in pairs:
            ids, was_truncated = self.bounded_prompt_ids(
                tokenizer, step.prompts[groups[i]], step.texts[i], None if ref is None else step.texts[ref], budget
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
        row_seeds = rollout_seeds(seed, step.step, CORRECTIONS, B * self.k, rank=rank)
        seeds = [row_seeds[i * self.k + j] for i, _ in pairs for j in range(self.k)]
        # Called on every rank, with no prompts where there is nothing to correct (a collective).
        batch = pl_module.engine.generate(prompt_ids, n=self.k, seeds=seeds, sampling=sampling)
        if not pairs:
            out.metrics = {"train/corrections": 0.0, "train/rewrite_rate": 0.0, **long_metrics}
            step.corrections = out
            return
        corrected = batch.response_lists()
        texts = tokenizer.batch_decode(corrected, skip_special_tokens=True)
        source = [pairs[m][0] for m in batch.group_index.tolist()]  # the wrong rollout each sample corrects
        scores = pl_module.score(texts, [step.prompts[groups[i]] for i in source])

        # Shaping uses the first correction of each wrong rollout (row m * k).
        firsts = [m * self.k for m in range(len(pairs))]
        for m, row in enumerate(firsts):
            i, ref = pairs[m]
            out.rewards[i] = scores[row]
            out.distance[i] = normalized_edit_distance(responses[i], corrected[row])
            kept = kept_positions(responses[i], corrected[row])
            out.kept_mask[i, : len(kept)] = torch.tensor(kept, dtype=torch.bool)
        success = [m for m, row in enumerate(firsts) if scores[row] == 1]
        alpha = self.alpha
        if alpha == "adaptive":
            alpha = adaptive_alpha([float(out.distance[pairs[m][0]]) for m in success])
        out.alpha = float(alpha)
        for m in success:
            i, ref = pairs[m]
            out.rewrite[i] = is_rewrite(
                responses[i], corrected[firsts[m]], None if ref is None else responses[ref], float(alpha)
            )

        if self.train_on_corrections:
            if self.grouping == "prompt":
                train_groups = torch.tensor([groups[i] for i in source], dtype=torch.long)
            else:
                train_groups = batch.group_index.cpu()
            out.train_batch = replace(batch, group_index=train_groups.to(batch.group_index.device))
            out.train_rewards = scores
        out.generated_tokens = int(batch.response_mask.sum())
        out.prompt_tokens = int(batch.prompt_mask.sum())
        n_success = len(success)
        scored = scores[~scores.isnan()]
        out.metrics = {
            "train/corrections": float(len(texts)),
            "train/correction_success": float((scored == 1).float().mean()) if scored.numel() else math.nan,
            # share of successful corrections that are full rewrites; 0 when none succeeded
            "train/rewrite_rate": float(out.rewrite.sum()) / max(n_success, 1),
            "train/correction_alpha": out.alpha,
            "train/correction_distance": float(out.distance.nanmean()),
            **long_metrics,
        }
        step.corrections = out

    # --------------------------------------------------------------- pieces
    def correction_pairs(
        self, rewards: list[float], groups: list[int], seed: int, step: int, rank: int = 0
    ) -> list[tuple[int, Optional[int]]]:
        """``(i, ref)`` for every wrong rollout ``i`` that gets a correction; with
        ``reference: none`` every wrong rollout, paired with None (no reference is drawn)."""
        if self.reference == "none":
            return [(i, None) for i, reward in enumerate(rewards) if reward == 0]  # NaN is not wrong
        return self.choose_references(rewards, groups, seed, step, rank=rank)

    @staticmethod
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

    def correction_prompt_text(
        self, problem: str, attempt: str, reference: Optional[str], instruction: Optional[str], task: str = "math"
    ) -> str:
        """The user message of ``x~ = (x; y_i, y_ref)``, or of ``(x; y_i)`` when ``reference``
        is None (the self-revision prompt of ``reference: none``)."""
        if task == "code":
            from ibpo_lit.rewards.code import extract_code

            def block(text: str) -> str:
                return f"```python\n{extract_code(text).rstrip()}\n```"

            if reference is None:
                return f"{self.self_revision_code_template}\n\nProblem:\n{problem}\n\nCandidate solution:\n{block(attempt)}"
            return (
                f"{self.code_template}\n\nProblem:\n{problem}\n\n"
                f"Candidate solution 1:\n{block(attempt)}\n\n"
                f"Candidate solution 2:\n{block(reference)}"
            )
        answer = self.answer_instruction or instruction or DEFAULT_ANSWER_INSTRUCTION
        if reference is None:
            return f"{self.self_revision_template}\n\nProblem:\n{problem}\n\nCandidate solution:\n{attempt}\n\n{answer}"
        return (
            f"{self.template}\n\nProblem:\n{problem}\n\n"
            f"Candidate solution 1:\n{attempt}\n\nCandidate solution 2:\n{reference}\n\n{answer}"
        )

    def bounded_prompt_ids(
        self, tokenizer, prompt, attempt: str, reference: Optional[str], budget: Optional[int]
    ) -> tuple[Optional[list[int]], bool]:
        """``(ids, truncated)``: the correction prompt within ``budget`` tokens (None: no
        bound); with ``on_long_prompt: skip``, ``(None, False)`` when it does not fit."""
        ids = self.correction_prompt_ids(tokenizer, prompt, attempt, reference)
        if budget is None or len(ids) <= budget:
            return ids, False
        if self.on_long_prompt == "skip":
            return None, False
        over = len(ids) - budget
        texts = [attempt] if reference is None else [attempt, reference]
        lengths = [len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts]
        # Shorten each candidate in proportion to its length, with room for the markers.
        for extra in (16, 64, 256):
            cut = [math.ceil((over + extra) * n / max(sum(lengths), 1)) for n in lengths]
            short = [_cut_middle(tokenizer, t, c) for t, c in zip(texts, cut)]
            ids = self.correction_prompt_ids(tokenizer, prompt, short[0], short[1] if reference is not None else None)
            if len(ids) <= budget:
                return ids, True
        return None, False  # the problem alone does not leave room: nothing to correct

    def correction_prompt_ids(self, tokenizer, prompt, attempt: str, reference: Optional[str]) -> list[int]:
        """Token ids of the correction prompt, through the chat template when the tokenizer has one."""
        text = self.correction_prompt_text(
            prompt.problem, attempt, reference, prompt.meta.get("instruction"), task=prompt.task
        )
        if getattr(tokenizer, "chat_template", None):
            messages = []
            if prompt.meta.get("system_prompt"):
                messages.append({"role": "system", "content": prompt.meta["system_prompt"]})
            messages.append({"role": "user", "content": text})
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return tokenizer(text, add_special_tokens=False).input_ids
        return tokenizer(text).input_ids


def _cut_middle(tokenizer, text: str, drop: int) -> str:
    """``text`` without ``drop`` tokens from its middle, marked where they were."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if drop <= 0:
        return text
    if drop >= len(ids):
        return f"[... {len(ids)} tokens omitted ...]"
    head = (len(ids) - drop) // 2
    tail = len(ids) - drop - head
    return (
        tokenizer.decode(ids[:head]) + f"\n[... {drop} tokens omitted ...]\n" + tokenizer.decode(ids[len(ids) - tail :])
    )
