"""Test-time compare-and-correct, run: one correction per sample, generated and scored.

The choices (which samples, which reference, the oracle) and the arithmetic are in
``ibpo_lit.evaluation.baselines``; this module is the stage that needs the model.

What is covered:
- The correction prompt is training's: ``ibpo_lit.data.correction_prompt.CorrectionPrompt`` with its
  default templates (math: both solutions quoted, then the problem's own answer instruction;
  code: both programs as ```python blocks), rendered with the chat template and system prompt
  of the evaluation's prompts.
- Decoding is the evaluation's (same engine and ``SamplingConfig``). The correction of sample j
  of problem p is drawn with seed ``rollout_seeds(seed, p, CORRECTIONS, k)[j]``: independent of
  ``batch_size``, and the same for the verifier-free and the oracle variant (common random
  numbers: the two differ only by their prompts).
- Scoring is the evaluation's (`score_samples`): math-verify workers or the code sandbox.
- A correction prompt longer than ``max_prompt_tokens`` stops the run before any correction is
  generated (cutting the quoted solutions would change the baseline).

What is not covered:
- Prompt templates other than training's defaults.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ibpo_lit.data.correction_prompt import CorrectionPrompt
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.evaluation.baselines import (
    CORRECTION_BASELINES,
    correction_metrics,
    reference_table,
)
from ibpo_lit.evaluation.metrics import correct_matrix
from ibpo_lit.evaluation.sampling import generate
from ibpo_lit.evaluation.scoring import Verdicts, score_samples, status_counts
from ibpo_lit.training.seeding import CORRECTIONS, rollout_seeds


@dataclass(frozen=True)
class CorrectionRun:
    refs: list[list[int]]  # [N][k] index of each sample's reference among its problem's samples
    texts: list[list[str]]  # [N][k] the corrections
    verdicts: Verdicts  # [N][k] their scores


def correction_prompt_ids(
    tokenizer, prompts: Sequence[Prompt], completions: Sequence[Sequence[str]], refs: Sequence[Sequence[int]],
    max_prompt_tokens: int,
) -> list[list[int]]:
    """Token ids of every correction prompt, problem-major ([N * k]), training's template."""
    builder = CorrectionPrompt()
    ids = []
    for prompt, samples, row in zip(prompts, completions, refs):
        for j, ref in enumerate(row):
            prompt_ids = builder.ids(tokenizer, prompt, samples[j], samples[ref])
            if len(prompt_ids) > max_prompt_tokens:
                raise ValueError(
                    f"correction prompt of {prompt.uid} sample {j} has {len(prompt_ids)} tokens > "
                    f"max_prompt_tokens={max_prompt_tokens} (it quotes two responses): raise max_prompt_tokens"
                )
            ids.append(prompt_ids)
    return ids


def correct_samples(
    engine, tokenizer, prompts: Sequence[Prompt], completions: Sequence[Sequence[str]],
    refs: Sequence[Sequence[int]], *, task: str, seed: int, batch_size: int, max_prompt_tokens: int,
    sandbox_workers: int,
) -> CorrectionRun:
    """Generate and score the correction of every sample, each against its reference ``refs[p][j]``."""
    k = len(refs[0])
    ids = correction_prompt_ids(tokenizer, prompts, completions, refs, max_prompt_tokens)
    seeds = [s for p in range(len(prompts)) for s in rollout_seeds(seed, p, CORRECTIONS, k)]
    # batch_size problems per call, as for the samples: batch_size * k rows of one correction each
    texts, _, _ = generate(engine, tokenizer, ids, 1, seeds, batch_size * k, what="corrections")
    per_problem = [[texts[p * k + j][0] for j in range(k)] for p in range(len(prompts))]
    verdicts = score_samples(task, per_problem, [p.gold for p in prompts], sandbox_workers)
    return CorrectionRun([list(r) for r in refs], per_problem, verdicts)


def run_correction_baseline(
    name: str, engine, tokenizer, prompts: Sequence[Prompt], completions: Sequence[Sequence[str]],
    answers: Sequence[Sequence[str | None]], correct: torch.Tensor, *, task: str, seed: int,
    batch_size: int, max_prompt_tokens: int, sandbox_workers: int, keep_completions: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One correction baseline (``test_time_correction`` or its ``_oracle``), end to end.

    Returns:
        ``(metrics, per_problem)``: metrics keyed ``<prefix>@1``, ``<prefix>_fixed``,
        ``<prefix>_broken`` (and ``<prefix>_sandbox_status`` for code), prefix ``ttc`` or
        ``ttc_oracle``; per problem, ``<prefix>_refs`` and ``<prefix>_scores`` (and the
        correction texts with ``keep_completions``).
    """
    prefix = CORRECTION_BASELINES[name]
    refs = reference_table(seed, answers, correct.tolist(), oracle=name == "test_time_correction_oracle")
    run = correct_samples(engine, tokenizer, prompts, completions, refs, task=task, seed=seed,
                          batch_size=batch_size, max_prompt_tokens=max_prompt_tokens, sandbox_workers=sandbox_workers)
    moved = correction_metrics(correct, correct_matrix(run.verdicts.scores))
    metrics: dict[str, Any] = {f"{prefix}@1": moved["@1"], f"{prefix}_fixed": moved["fixed"],
                               f"{prefix}_broken": moved["broken"]}
    if run.verdicts.statuses is not None:
        metrics[f"{prefix}_sandbox_status"] = status_counts(run.verdicts.statuses)
    per_problem = []
    for p in range(len(prompts)):
        record = {f"{prefix}_refs": run.refs[p], f"{prefix}_scores": run.verdicts.scores[p]}
        if keep_completions:
            record[f"{prefix}_completions"] = run.texts[p]
        per_problem.append(record)
    return metrics, per_problem
