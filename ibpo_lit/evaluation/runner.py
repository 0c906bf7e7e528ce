"""Evaluate a policy on a math benchmark: k samples per problem, scored by math-verify.

Stages, each a small function: ``load_problems`` (benchmark records) -> ``load_model``
(hub id / directory / built-in, optionally a Lightning checkpoint's weights) -> ``build_prompts``
(``PromptBuilder``) -> ``sample`` (``HFRolloutEngine``, batches of problems) -> ``score``
(``math_scores``) -> ``summarize`` (metrics and per-problem records).

What is covered:
- Decoding defaults are the paper's (Qwen3 recommendation): temperature 0.6, top-p 0.95,
  top-k 20, min-p 0. ``top_k=1`` is greedy decoding.
- Seeds: sample j of problem i (i = its index in the benchmark) is drawn with seed
  ``rollout_seeds(seed, i, MAIN_ROLLOUTS, k)[j]``, so results do not depend on ``batch_size``,
  and a seed reproduces a run (up to kernel float noise, see ``ibpo_lit.rollout.hf``).
- Built-in random models (``tiny-llama``) are built with weight seed 0 whatever ``seed`` is:
  ``seed`` varies the sampling only, so runs over seeds evaluate one model.
- Unscorable samples (the verifier returns None, e.g. a gold that does not parse) count as not
  correct; their share is reported as ``unscorable_frac`` so it is never silent.
- Prompts longer than ``max_prompt_tokens`` stop the run (skipping or truncating would change
  the benchmark).

What is not covered:
- vLLM or any engine faster than ``HFRolloutEngine``; multi-GPU sharding.
- Code benchmarks (a sandbox verifier).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import torch
from torchmetrics.aggregation import MeanMetric

from ibpo_lit.data.prompt import Prompt
from ibpo_lit.data.prompt_builder import PromptBuilder
from ibpo_lit.data.records import Record
from ibpo_lit.evaluation.answers import extract_answer
from ibpo_lit.evaluation.checkpoint import load_checkpoint_weights
from ibpo_lit.evaluation.metrics import avg_at_k, correct_matrix, maj_at_k, mean_pass_at_k
from ibpo_lit.models.loading import DTYPES, load_policy
from ibpo_lit.rewards import math_scores
from ibpo_lit.rollout.engine import SamplingConfig
from ibpo_lit.seeding import MAIN_ROLLOUTS, rollout_seeds

logger = logging.getLogger(__name__)

DEFAULT_INSTRUCTION = "Think step by step, then give the final answer after ####."
MODEL_WEIGHT_SEED = 0  # built-in random models: one set of weights for every evaluation seed


def evaluate(
    model_name_or_path: str,
    benchmark: str,
    path: str | None = None,
    k: int = 4,
    limit: int | None = None,
    temperature: float = 0.6,
    top_p: float = 0.95,
    top_k: int = 20,
    min_p: float = 0.0,
    max_new_tokens: int = 1024,
    instruction: str = DEFAULT_INSTRUCTION,
    system_prompt: str | None = None,
    seed: int = 0,
    batch_size: int = 8,
    ckpt_path: str | None = None,
    dtype: str = "float32",
    max_prompt_tokens: int = 4096,
    device: str | None = None,
    keep_completions: bool = False,
) -> dict[str, Any]:
    """Sample ``k`` responses per problem of a benchmark and report avg@k, pass@k and maj@k.

    Args:
        model_name_or_path: Hugging Face hub id, local ``save_pretrained`` directory, or a
            built-in name (``tiny-llama``). With ``ckpt_path``, the model the run was trained from.
        benchmark: gsm8k, gsm8k_train, math500, aime25 or hmmt25.
        path: A local JSONL file of the benchmark; None reads it from the Hugging Face hub.
        k: Samples per problem (the paper uses 64).
        limit: Evaluate only the first ``limit`` problems; None for all.
        temperature: Sampling temperature (paper: 0.6).
        top_p: Nucleus mass (paper: 0.95); 1 disables it.
        top_k: Keep the k most likely tokens (paper: 20); 0 disables it, 1 is greedy.
        min_p: Min-p filter (paper: 0); 0 disables it.
        max_new_tokens: Longest response in tokens; longer ones are cut and count as truncated.
        instruction: Appended to each problem; answers after ``####`` or in ``\\boxed{}`` are read.
        system_prompt: Optional system message of the chat template.
        seed: Sampling seed; evaluate several seeds and combine them for a confidence interval.
        batch_size: Problems per generate call (each brings k rows).
        ckpt_path: A Lightning checkpoint of IBPOModule (``.../checkpoints/last.ckpt``) whose
            policy weights replace the loaded ones.
        dtype: Model dtype: float32, bfloat16 or float16.
        max_prompt_tokens: A longer prompt stops the evaluation with an error.
        device: Torch device; None picks cuda when available, else cpu.
        keep_completions: Also store every completion text in the per-problem records.

    Returns:
        The result dict: settings, ``avg@k``, ``pass@1``, ``pass@k``, ``maj@k``,
        ``response_len``, ``truncated_frac``, ``unscorable_frac``, ``seconds`` and ``problems``
        (per problem: uid, gold, n_correct, n_unscorable, scores, answers).
    """
    start = time.perf_counter()
    sampling = SamplingConfig(temperature, top_p, top_k, min_p, max_new_tokens)  # validates
    _check_settings(k=k, limit=limit, batch_size=batch_size, dtype=dtype)
    records = load_problems(benchmark, path, limit)
    model, tokenizer = load_model(model_name_or_path, ckpt_path, dtype, device)
    builder = PromptBuilder(
        tokenizer, instruction=instruction, system_prompt=system_prompt,
        max_prompt_tokens=max_prompt_tokens, on_long_prompt="error",
    )
    prompts = [builder.build(r.problem, r.gold, r.uid) for r in records]
    gen_start = time.perf_counter()
    completions, lengths, finished = sample(model, tokenizer, prompts, k, sampling, seed, batch_size)
    gen_seconds = time.perf_counter() - gen_start
    scores = score(completions, [p.gold for p in prompts])
    result = summarize(prompts, completions, scores, lengths, finished, k, keep_completions)
    result = {
        "benchmark": benchmark,
        "path": path,
        "model": model_name_or_path,
        "ckpt": ckpt_path,
        "k": k,
        "n_problems": len(prompts),
        "limit": limit,
        "seed": seed,
        "decoding": {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
                     "max_new_tokens": max_new_tokens},
        "instruction": instruction,
        "system_prompt": system_prompt,
        "dtype": dtype,
        **result,
        "generate_seconds": gen_seconds,
        "seconds": time.perf_counter() - start,
    }
    return result


def _check_settings(k: int, limit: int | None, batch_size: int, dtype: str) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")


def load_problems(benchmark: str, path: str | None, limit: int | None) -> list[Record]:
    """The benchmark's records (``ibpo_lit.data.benchmarks.load_benchmark``)."""
    from ibpo_lit.data.benchmarks import load_benchmark  # the data room owns benchmark formats

    records = load_benchmark(benchmark, path=path, limit=limit)
    if not records:
        raise ValueError(f"benchmark {benchmark!r} ({path or 'hub'}) has no problems")
    return list(records)


def load_model(model_name_or_path: str, ckpt_path: str | None, dtype: str, device: str | None):
    """``(model, tokenizer)`` in eval mode on ``device``, with a checkpoint's weights if given."""
    model, tokenizer = load_policy(model_name_or_path, dtype=dtype, seed=MODEL_WEIGHT_SEED)
    if ckpt_path is not None:
        load_checkpoint_weights(model, ckpt_path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer


def eos_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's EOS plus the generation config's (as ``IBPOModule`` stops rollouts)."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def sample(
    model, tokenizer, prompts: Sequence[Prompt], k: int, sampling: SamplingConfig, seed: int, batch_size: int
) -> tuple[list[list[str]], list[list[int]], list[list[bool]]]:
    """Per problem: k completion texts, their lengths in tokens and whether each ended with EOS."""
    from ibpo_lit.rollout.hf import HFRolloutEngine  # transformers' generation code is slow to import

    engine = HFRolloutEngine(model, eos_token_ids(model, tokenizer), tokenizer.pad_token_id, sampling)
    texts, lengths, finished = [], [], []
    for first in range(0, len(prompts), batch_size):
        chunk = prompts[first : first + batch_size]
        seeds = [s for i in range(first, first + len(chunk)) for s in rollout_seeds(seed, i, MAIN_ROLLOUTS, k)]
        batch = engine.generate([p.prompt_ids for p in chunk], n=k, seeds=seeds).to("cpu")
        decoded = tokenizer.batch_decode(batch.response_lists(), skip_special_tokens=True)
        for p in range(len(chunk)):
            rows = slice(p * k, (p + 1) * k)
            texts.append(decoded[rows])
            lengths.append(batch.response_lengths[rows].tolist())
            finished.append(batch.finished[rows].tolist())
        logger.info("generated %d/%d problems", first + len(chunk), len(prompts))
    return texts, lengths, finished


def score(completions: Sequence[Sequence[str]], golds: Sequence[str]) -> list[list[float | None]]:
    """Verifier scores per problem and sample: 1.0, 0.0, or None (unscorable or timed out).

    One ``math_scores`` call for the whole benchmark: math-verify runs in worker processes that
    are killed past their timeout, so one pathological completion cannot stall the evaluation.
    """
    flat = [c for per_problem in completions for c in per_problem]
    flat_golds = [g for g, per_problem in zip(golds, completions) for _ in per_problem]
    flat_scores = list(math_scores(flat, flat_golds))
    out, at = [], 0
    for per_problem in completions:
        out.append(flat_scores[at : at + len(per_problem)])
        at += len(per_problem)
    return out


def summarize(
    prompts: Sequence[Prompt],
    completions: Sequence[Sequence[str]],
    scores: Sequence[Sequence[float | None]],
    lengths: Sequence[Sequence[int]],
    finished: Sequence[Sequence[bool]],
    k: int,
    keep_completions: bool = False,
) -> dict[str, Any]:
    """Metrics and per-problem records from the sampled and scored completions."""
    correct = correct_matrix(scores)  # [N, k]
    answers = [[extract_answer(c) for c in per_problem] for per_problem in completions]
    num_correct = correct.sum(dim=1)  # [N]
    response_len, truncated = MeanMetric(), MeanMetric()
    for lens, fin in zip(lengths, finished):
        response_len.update(torch.tensor(lens, dtype=torch.float32))
        truncated.update((~torch.tensor(fin, dtype=torch.bool)).float())
    n_unscorable = [sum(s is None for s in row) for row in scores]
    problems = []
    for p, prompt in enumerate(prompts):
        record = {
            "uid": prompt.uid,
            "gold": prompt.gold,
            "n_correct": int(num_correct[p]),
            "n_unscorable": n_unscorable[p],
            "scores": list(scores[p]),
            "answers": answers[p],
        }
        if keep_completions:
            record["completions"] = list(completions[p])
        problems.append(record)
    return {
        "avg@k": avg_at_k(correct),
        "pass@1": mean_pass_at_k(num_correct, n=k, k=1),
        "pass@k": mean_pass_at_k(num_correct, n=k, k=k),
        "maj@k": maj_at_k(answers, correct.tolist()),
        "response_len": float(response_len.compute()),
        "truncated_frac": float(truncated.compute()),
        "unscorable_frac": sum(n_unscorable) / (len(prompts) * k),
        "problems": problems,
    }
