"""Verdicts on sampled completions, by the task's verifier in the task's pool (``ibpo_lit.tasks``).

What is covered:
- `score_samples(task, completions, golds, workers, timeout_s)`: per problem and sample, a score
  (1.0 correct, 0.0 wrong, None unscorable) as `Verdicts`, in one batch through the pool training
  scores that task with (math: math-verify in ``workers`` worker processes, each item killed
  past ``timeout_s``; code: ``workers`` sandboxes at a time, each program bounded by its tests'
  own limits). Nothing is scored in the evaluating process.
- Code: a sample is correct when every test passes (whatever the gold's ``reward`` mode), and
  `Verdicts` also holds the fraction of tests it passed and its sandbox status (``pass``,
  ``fail``, ``timeout``, ``memory``, ``error``, or ``unscorable`` when the harness failed).
- `status_counts` over those statuses.

What is not covered:
- Retries of unscorable samples: they stay None (counted by the caller, never a silent 0).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ibpo_lit.rewards.code import STATUSES
from ibpo_lit.tasks import UNSCORABLE, get_task

DEFAULT_TIMEOUT_S = 5.0  # per math item, as training's default ``model.reward_timeout_s``


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
    task: str, completions: Sequence[Sequence[str]], golds: Sequence[str], workers: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Verdicts:
    """Score every completion of every problem against its problem's gold, in one batch."""
    judge = get_task(task)
    pairs = [(c, g) for g, per_problem in zip(golds, completions) for c in per_problem]
    sizes = [len(per_problem) for per_problem in completions]
    with judge.scoring_pool(workers, timeout_s) as pool:
        judged = judge.judge(pool, pairs)
    return Verdicts(_unflatten(judged.scores, sizes),
                    None if judged.test_fracs is None else _unflatten(judged.test_fracs, sizes),
                    None if judged.statuses is None else _unflatten(judged.statuses, sizes))


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
