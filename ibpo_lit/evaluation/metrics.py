"""Evaluation metrics over k samples per problem: pure functions, no model.

What is covered:
- ``avg_at_k``: mean accuracy over all N x k samples (the paper's avg@64).
- ``pass_at_k``: the unbiased estimator of Chen et al. 2021 (Codex), ``1 - C(n-c, k) / C(n, k)``,
  in the product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, which never forms a binomial
  coefficient (no overflow for n = 64 or 1024). ``mean_pass_at_k`` averages it over problems.
- ``maj_at_k``: majority vote over the extracted answers of each problem's samples (see
  ``ibpo_lit.rewards.answers`` for how answers are extracted and made comparable). Math
  only: programs have no canonical answer to vote on, so code results carry ``maj@k = None``.
- ``mean_test_fraction``: the mean share of a code benchmark's tests that a sample passes (partial
  credit, reported beside pass@k, which counts a sample only when all its tests pass).

What is not covered:
- Unscorable samples (the verifier returned None) are the caller's choice; the runner counts
  them as not correct and reports how many there were.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch
from torch import Tensor


def avg_at_k(correct: Tensor) -> float:
    """Mean accuracy over every sample.

    Args:
        correct: [N, k] bool or float (0/1) tensor, ``correct[p, j]`` for sample j of problem p.

    Returns:
        ``correct.mean()`` as a float: avg@k (equal to the mean of per-problem pass@1).
    """
    if correct.dim() != 2 or correct.numel() == 0:
        raise ValueError(f"correct must be a non-empty [N, k] tensor, got shape {tuple(correct.shape)}")
    return float(correct.float().mean())


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: P(at least one of k draws without replacement is correct).

    Args:
        n: Samples drawn for the problem.
        c: How many of them are correct (0 <= c <= n).
        k: Budget (1 <= k <= n).

    Returns:
        ``1 - C(n-c, k) / C(n, k)``; 1.0 when ``n - c < k`` (every k-subset holds a correct one).
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(num_correct: Sequence[int] | Tensor, n: int, k: int) -> float:
    """pass@k averaged over problems, each with ``n`` samples of which ``num_correct[p]`` are correct."""
    counts = [int(c) for c in (num_correct.tolist() if isinstance(num_correct, Tensor) else num_correct)]
    if not counts:
        raise ValueError("mean_pass_at_k needs at least one problem")
    return sum(pass_at_k(n, c, k) for c in counts) / len(counts)


def majority_answer(answers: Sequence[str | None]) -> int | None:
    """Index of the first sample carrying the most frequent non-None answer, or None if all are None.

    Ties between answers are broken by first occurrence: of the tied answers, the one that
    appears earliest among the samples wins.
    """
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    for index, answer in enumerate(answers):
        if answer is not None and counts[answer] == best:
            return index
    raise AssertionError("unreachable")


def maj_at_k(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]) -> float:
    """Majority-vote accuracy.

    Args:
        answers: Per problem, the k extracted answers (None where nothing was extracted).
        correct: Per problem, the k correctness flags of the same samples.

    Returns:
        The share of problems whose majority answer (``majority_answer``) is correct, judged by
        the flag of the first sample carrying it (samples with equal extracted answers get equal
        verdicts from the verifier). A problem whose samples all lack an answer counts as wrong.
    """
    if len(answers) != len(correct) or not answers:
        raise ValueError(f"need the same, non-zero number of problems: {len(answers)} answers, {len(correct)} correct")
    hits = 0
    for p, (ans, ok) in enumerate(zip(answers, correct)):
        if len(ans) != len(ok):
            raise ValueError(f"problem {p}: {len(ans)} answers but {len(ok)} correctness flags")
        index = majority_answer(ans)
        hits += int(index is not None and bool(ok[index]))
    return hits / len(answers)


def correct_matrix(scores: Sequence[Sequence[float | None]]) -> Tensor:
    """[N, k] bool tensor from per-problem verifier scores; None (unscorable) counts as not correct."""
    return torch.tensor([[s is not None and s > 0.5 for s in row] for row in scores], dtype=torch.bool)


def mean_test_fraction(fractions: Sequence[Sequence[float | None]]) -> float:
    """Mean, over every sample of every problem, of the fraction of its tests it passed.

    Args:
        fractions: Per problem, per sample, a fraction in [0, 1] or None (unscorable), which
            counts as 0: as in ``correct_matrix``, a sample the harness could not score passed nothing.
    """
    values = [0.0 if f is None else float(f) for row in fractions for f in row]
    if not values:
        raise ValueError("mean_test_fraction needs at least one sample")
    if not all(0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"fractions must lie in [0, 1], got {[v for v in values if not 0 <= v <= 1][:3]}")
    return sum(values) / len(values)
