"""Per-rollout seeds: a pure function of (base seed, rollout step, stream, row), so that a
resumed run samples exactly what an uninterrupted one would, and rank ``r`` of several processes
samples what one process would for the same rows. The base is a stream's seed, decided by
`ibpo_lit.seeds.stream_seed` (its own setting, else ``seed_everything``'s, else 0)."""
from __future__ import annotations

# Streams keep the seeds of different samplers of one step apart.
MAIN_ROLLOUTS = 0
CORRECTIONS = 1
REFERENCE_CHOICE = 2
VALIDATION = 3  # with step = batch index: every validation run samples with the same seeds
BENCHMARK_VALIDATION = 4  # data.val_benchmarks; step = batch index + 10_000 x dataloader index

_MOD = 2**62


def rollout_seeds(base: int, step: int, stream: int, count: int, rank: int = 0) -> list[int]:
    """``count`` distinct seeds for one stream of one step, on process ``rank``.

    Rows of a step are consecutive integers above a per-(base, step, stream) offset spaced
    2**20 apart; rank ``r`` takes rows ``r * count ..``, so no two rows of a run share a seed
    while a step has fewer than a million rows over all processes, and rank 0 of a
    multi-process run samples what a single-process run would.
    """
    offset = ((base * 1_000_003 + step) * 8 + stream) * 2**20 + rank * count
    return [(offset + row) % _MOD for row in range(count)]
