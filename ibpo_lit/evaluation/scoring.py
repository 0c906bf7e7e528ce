"""Verdicts on sampled completions: math by math-verify, code by running its tests in the sandbox.

What is covered:
- `score_samples(task, completions, golds, sandbox_workers)`: per problem and sample, a score
  (1.0 correct, 0.0 wrong, None unscorable) as `Verdicts`. Nothing is scored in the evaluating
  process: math goes through ``math_scores`` (worker processes, killed past their timeout), code
  through a `SandboxPool` of ``sandbox_workers`` programs at a time (each program runs in its
  own sandbox processes; its time limit is enforced by killing them).
- Code: a sample is correct when every test passes (whatever the gold's ``reward`` mode), and
  `Verdicts` also holds the fraction of tests it passed and its sandbox status (``pass``,
  ``fail``, ``timeout``, ``memory``, ``error``, or ``unscorable`` when the harness failed).
- Pure helpers over those: `code_verdict` (one sandbox result), `status_counts`.

What is not covered:
- Retries of unscorable samples: they stay None (counted by the caller, never a silent 0).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ibpo_lit.rewards import math_scores, scoring_pool
from ibpo_lit.rewards.code import STATUSES, CodeResult

UNSCORABLE = "unscorable"  # as SandboxPool counts a run the harness could not score
TASKS = ("math", "code")


@dataclass(frozen=True)
class Verdicts:
    """Verifier output for N problems with k samples each.

    Args:
        scores: [N][k] 1.0 (correct), 0.0 (wrong) or None (unscorable).
        test_fracs: [N][k] fraction of the tests passed (None: unscorable); code only, else None.
        statuses: [N][k] sandbox status of each run (`STATUSES` or "unscorable"); code only.
    """

    scores: list[list[float | None]]
    test_fracs: list[list[float | None]] | None = None
    statuses: list[list[str]] | None = None


def score_samples(
    task: str, completions: Sequence[Sequence[str]], golds: Sequence[str], sandbox_workers: int = 2
) -> Verdicts:
    """Score every completion of every problem against its problem's gold, in one batch."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    flat = [c for per_problem in completions for c in per_problem]
    flat_golds = [g for g, per_problem in zip(golds, completions) for _ in per_problem]
    sizes = [len(per_problem) for per_problem in completions]
    if task == "math":
        return Verdicts(scores=_unflatten(list(math_scores(flat, flat_golds)), sizes))
    verdicts = [code_verdict(r) for r in _run_code(flat, flat_golds, sandbox_workers)]
    scores, fracs, statuses = (list(column) for column in zip(*verdicts)) if verdicts else ([], [], [])
    return Verdicts(_unflatten(scores, sizes), _unflatten(fracs, sizes), _unflatten(statuses, sizes))


def _run_code(completions: list[str], golds: list[str], workers: int) -> list[CodeResult | None]:
    with scoring_pool("code", num_workers=workers) as pool:  # training's pool for code, too
        return pool.run(list(zip(completions, golds)))


def code_verdict(result: CodeResult | None) -> tuple[float | None, float | None, str]:
    """``(score, fraction of tests passed, status)`` of one sandbox run; None: unscorable.

    The score is 1.0 only when every test passed, the binary reward of METHOD section 1.
    """
    if result is None:
        return None, None, UNSCORABLE
    return (1.0 if result.passed == result.total else 0.0), result.fraction, result.status


def status_counts(statuses: Sequence[Sequence[str]]) -> dict[str, int]:
    """How many runs ended in each status, every status listed (zeros included), in a fixed order."""
    counts = Counter(s for row in statuses for s in row)
    unknown = set(counts) - {*STATUSES, UNSCORABLE}
    if unknown:
        raise ValueError(f"unknown sandbox statuses {sorted(unknown)}")
    return {status: counts[status] for status in (*STATUSES, UNSCORABLE)}


def _unflatten(flat: list, sizes: Sequence[int]) -> list[list]:
    out, at = [], 0
    for size in sizes:
        out.append(flat[at : at + size])
        at += size
    return out
