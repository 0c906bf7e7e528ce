"""Baselines of the IBPO paper's Table 1, computed from one evaluation's k samples: pure functions.

What is covered:
- Names: ``test_time_correction``, ``test_time_correction_oracle``, ``best_of_n``
  (`parse_baselines` validates them; an unknown name is a ValueError listing the valid ones).
- Test-time compare-and-correct. Every sample ``j`` of a problem is corrected once: its
  reference ``y_ref`` is another sample of the same problem, the policy compares the two and
  writes a corrected solution (training's prompt, ``callbacks.correction``), which is scored.
  Correcting every sample, not one per problem, keeps the result on avg@k's footing (the same
  N x k samples, paired before/after) at the cost of one more generation per sample.
  At test time the gold is unknown, so the reference cannot be "a correct rollout" as in
  METHOD section 5. Two pickers:
  * ``test_time_correction`` (verifier-free, the honest baseline): ``consensus_candidates`` —
    the other samples whose extracted answer is among the most frequent answers of the k
    samples, when at least two samples agree on it; else any other sample. Code has no answer
    to agree on, so its reference is any other sample, uniformly.
  * ``test_time_correction_oracle`` (an ORACLE: it reads the gold verdicts):
    ``oracle_candidates`` — METHOD's rule, the other correct samples, else any other sample.
    Every sample is still corrected (METHOD corrects wrong rollouts only; an oracle that also
    knew which samples to leave alone would break none by construction), so the two variants
    differ only in the reference picked.
  The pick is uniform over the candidates with a ``random.Random`` per sample, seeded by
  ``rollout_seeds(seed, problem, REFERENCE_CHOICE, k)[j]``: independent of batch size.
  `correction_metrics`: ``@1`` (mean accuracy after correction, over all samples),
  ``fixed`` (share of wrong samples whose correction is correct), ``broken`` (share of correct
  samples whose correction is wrong).
- Best-of-N: picking the best of N samples with the gold verifier is correct exactly when one
  of the N is correct, so ``best_of_n`` IS pass@N (N = k). The verifier-free pick, the answer
  most samples agree on, is maj@k (``best_of_n_majority``; math only).

What is not covered:
- Correcting a correction again (one round only), or several corrections per sample.
- Unscorable samples are corrected like the others, count as wrong before and after, and may be
  references (METHOD leaves NaN rollouts out of training's correction step).
- Reward-model Best-of-N (there is no reward model here).
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Sequence

from torch import Tensor

from ibpo_lit.training.seeding import REFERENCE_CHOICE, rollout_seeds

BASELINES = ("test_time_correction", "test_time_correction_oracle", "best_of_n")
CORRECTION_BASELINES = {"test_time_correction": "ttc", "test_time_correction_oracle": "ttc_oracle"}  # -> key prefix

NOTES = {
    "test_time_correction": (
        "verifier-free test-time compare-and-correct: every sample is corrected once, with as reference "
        "another sample of its problem whose answer is among the most frequent (when at least two samples "
        "agree), else any other sample; code: any other sample. ttc@1 = accuracy after correction, "
        "ttc_fixed = share of wrong samples fixed, ttc_broken = share of correct samples broken"
    ),
    "test_time_correction_oracle": (
        "ORACLE (uses the gold): as test_time_correction, but the reference is another correct sample when "
        "there is one (METHOD section 5's rule), else any other sample; an upper bound, not a baseline"
    ),
    "best_of_n": (
        "best of N = k samples picked with the gold verifier: that is pass@N, reported as best_of_n; "
        "best_of_n_majority picks the majority answer without the gold: maj@k (math only, None for code)"
    ),
}


def parse_baselines(value: str | Sequence[str] | None, k: int) -> tuple[str, ...]:
    """The baseline names asked for, validated, in order, without repeats.

    Args:
        value: Names as a list, or as one comma-separated string (``"best_of_n,test_time_correction"``).
        k: Samples per problem; a test-time correction needs a second sample as reference (k >= 2).

    Raises:
        ValueError: an unknown name (listing the valid ones), or a correction baseline with k < 2.
    """
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(str(n).strip() for n in items if str(n).strip()))
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; valid names: {list(BASELINES)}")
    if k < 2 and any(n in CORRECTION_BASELINES for n in names):
        raise ValueError(f"test-time correction needs k >= 2 (a reference among the other samples), got k={k}")
    return names


def consensus_candidates(answers: Sequence[str | None], i: int) -> list[int]:
    """Verifier-free reference candidates for sample ``i``: the other samples carrying one of the
    most frequent answers, when at least two samples share it; else every other sample."""
    others = [j for j in range(len(answers)) if j != i]
    counts = Counter(a for a in answers if a is not None)
    top = max(counts.values(), default=0)
    if top < 2:  # no two samples agree: no consensus to lean on
        return others
    agreed = {a for a, c in counts.items() if c == top}
    return [j for j in others if answers[j] in agreed] or others


def oracle_candidates(correct: Sequence[bool], i: int) -> list[int]:
    """ORACLE reference candidates for sample ``i`` (reads the gold): the other correct samples,
    else every other sample (METHOD section 5 step 1, applied to every sample)."""
    others = [j for j in range(len(correct)) if j != i]
    return [j for j in others if correct[j]] or others


def choose_references(candidates: Sequence[Sequence[int]], seeds: Sequence[int]) -> list[int]:
    """Sample ``j``'s reference: uniform over ``candidates[j]`` with its own generator ``seeds[j]``."""
    if len(candidates) != len(seeds):
        raise ValueError(f"{len(candidates)} candidate lists but {len(seeds)} seeds")
    if any(not c for c in candidates):
        raise ValueError("every sample needs at least one candidate reference (k >= 2)")
    return [random.Random(s).choice(list(c)) for c, s in zip(candidates, seeds)]


def reference_table(
    seed: int, answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]], oracle: bool
) -> list[list[int]]:
    """Per problem p and sample j, the index of sample j's reference among problem p's samples.

    Args:
        seed: The evaluation's seed; problem p draws with ``rollout_seeds(seed, p, REFERENCE_CHOICE, k)``.
        answers: [N][k] extracted answers (None: none; code has none), for the verifier-free pick.
        correct: [N][k] gold verdicts, read only when ``oracle`` is True.
        oracle: Pick by `oracle_candidates` (reads the gold) instead of `consensus_candidates`.
    """
    refs = []
    for p, (ans, ok) in enumerate(zip(answers, correct)):
        k = len(ok)
        candidates = [oracle_candidates(ok, j) if oracle else consensus_candidates(ans, j) for j in range(k)]
        refs.append(choose_references(candidates, rollout_seeds(seed, p, REFERENCE_CHOICE, k)))
    return refs


def correction_metrics(before: Tensor, after: Tensor) -> dict[str, float | None]:
    """Accuracy after one correction per sample, and how it moved.

    Args:
        before: [N, k] bool, the samples' correctness.
        after: [N, k] bool, the correctness of each sample's correction.

    Returns:
        ``{"@1": mean(after), "fixed": P(after | not before), "broken": P(not after | before)}``;
        ``fixed`` (``broken``) is None when no sample was wrong (correct).
    """
    if before.shape != after.shape or before.dim() != 2 or before.numel() == 0:
        raise ValueError(
            f"need two non-empty [N, k] tensors of one shape, got {tuple(before.shape)}, {tuple(after.shape)}"
        )
    before, after = before.bool(), after.bool()
    wrong, right = int((~before).sum()), int(before.sum())
    return {
        "@1": float(after.float().mean()),
        "fixed": int((~before & after).sum()) / wrong if wrong else None,
        "broken": int((before & ~after).sum()) / right if right else None,
    }
