"""Sampling for evaluation: a rollout engine over many prompts, with a seed per response.

The engine is training's own (``ibpo_lit.rollout.factory.build_engine``, HF or vLLM by
``--backend``), so an evaluation samples as a training run would. Every response's seed is fixed
before batching (the caller computes it from the problem's index and the sample's index,
``ibpo_lit.training.seeding``), and both engines sample each row with its own seed, so what a
problem gets does not depend on ``batch_size`` or on ``limit``. The two engines draw different
random numbers, so their samples differ; their metrics agree within sampling noise
(docs/evaluation.md has a measured comparison).
"""
from __future__ import annotations

import logging
from typing import Sequence

from ibpo_lit.data.prompt import Prompt
from ibpo_lit.training.seeding import MAIN_ROLLOUTS, rollout_seeds

logger = logging.getLogger(__name__)

Samples = tuple[list[list[str]], list[list[int]], list[list[bool]]]  # texts, lengths, finished per prompt


def close_engine(engine) -> None:
    """Shut a vLLM engine down (its worker state is per process); nothing to do for HF."""
    close = getattr(engine, "close", None)
    if callable(close):
        close()


def generate(engine, tokenizer, prompt_ids: Sequence[list[int]], n: int, seeds: Sequence[int],
             prompts_per_call: int, what: str = "problems") -> Samples:
    """``n`` responses per prompt; ``seeds`` holds one seed per response, prompt-major (P * n).

    Returns, per prompt: the n decoded texts, their lengths in tokens, and whether each ended
    with EOS (False: cut at ``max_new_tokens``).
    """
    if len(seeds) != len(prompt_ids) * n:
        raise ValueError(f"need {len(prompt_ids) * n} seeds, got {len(seeds)}")
    texts, lengths, finished = [], [], []
    for first in range(0, len(prompt_ids), prompts_per_call):
        chunk = prompt_ids[first : first + prompts_per_call]
        chunk_seeds = seeds[first * n : (first + len(chunk)) * n]
        batch = engine.generate(chunk, n=n, seeds=chunk_seeds).to("cpu")
        decoded = tokenizer.batch_decode(batch.response_lists(), skip_special_tokens=True)
        for p in range(len(chunk)):
            rows = slice(p * n, (p + 1) * n)
            texts.append(decoded[rows])
            lengths.append(batch.response_lengths[rows].tolist())
            finished.append(batch.finished[rows].tolist())
        logger.info("generated %d/%d %s", first + len(chunk), len(prompt_ids), what)
    return texts, lengths, finished


def sample(engine, tokenizer, prompts: Sequence[Prompt], k: int, seed: int, batch_size: int) -> Samples:
    """k samples per problem; sample j of problem i has seed ``rollout_seeds(seed, i, MAIN_ROLLOUTS, k)[j]``."""
    seeds = [s for i in range(len(prompts)) for s in rollout_seeds(seed, i, MAIN_ROLLOUTS, k)]
    return generate(engine, tokenizer, [p.prompt_ids for p in prompts], k, seeds, batch_size)
