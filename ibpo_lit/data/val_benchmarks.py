"""Evaluation benchmarks as validation sets while training (``data.val_benchmarks``).

Each ``ValBenchmark`` names a benchmark of ``python -m ibpo_lit evaluate`` (``gsm8k``, ``math500``,
``aime25``, ``hmmt25``, ``humaneval``, ``mbpp``, ...) and becomes one validation dataloader of its
own; the module logs it as ``val/<name>/avg@k`` and ``val/<name>/pass@k`` (k = ``model.val_samples``)
and scores it with the benchmark's verifier (math-verify or the code sandbox), whatever the
training reward is: AIME25 can be watched while training on GSM8K.

Prompts are built like the training prompts (same tokenizer, chat template, system prompt), with
the benchmark's own instruction (the evaluate command's default for its task) unless one is given.
A prompt longer than ``data.max_prompt_tokens`` is skipped and counted in the data module's stats:
a validation set is a measurement, so it is never truncated.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ibpo_lit.data.benchmarks import benchmark_task, load_benchmark
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.data.prompt_builder import PromptBuilder
from ibpo_lit.tasks import get_task

VAL_SET_KEY = "val_set"  # Prompt.meta key naming the validation set a prompt belongs to


@dataclass
class ValBenchmark:
    """One benchmark validated on while training.

    Args:
        name: A benchmark of ``python -m ibpo_lit evaluate`` (``gsm8k``, ``math500``, ``aime25``,
            ``hmmt25``, ``humaneval``, ``mbpp``, ``mbpp_sanitized``, ``livecodebench``).
        path: Its local JSONL file; unset reads it from the Hugging Face hub (needs network).
        limit: Validate on the first ``limit`` problems only (unset: all of them).
        instruction: Appended to every problem; unset = the evaluate command's default for the
            benchmark's task (math: answer after ``####``; code: one python block).
        log_name: The name in the logged keys (``val/<log_name>/avg@k``); unset = ``name``.
    """

    name: str
    path: Optional[str] = None
    limit: Optional[int] = None
    instruction: Optional[str] = None
    log_name: Optional[str] = None

    def __post_init__(self) -> None:
        self.task  # noqa: B018 - an unknown name fails here, listing the valid ones
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"data.val_benchmarks: {self.name}: limit must be >= 1 or unset, got {self.limit}")
        if self.path is not None:
            import os

            if not os.path.isfile(self.path):
                raise FileNotFoundError(f"data.val_benchmarks: {self.name}: no such file: {self.path}")

    @property
    def task(self) -> str:
        """The task that scores it (``ibpo_lit.tasks``): "math" or "code"."""
        return benchmark_task(self.name)

    @property
    def key(self) -> str:
        return self.log_name or self.name


def check_unique_names(benchmarks: list[ValBenchmark]) -> None:
    """Two sets logged under one name would mix their metrics."""
    keys = [b.key for b in benchmarks]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"data.val_benchmarks: {repeated} appear more than once: give each a distinct log_name")


def benchmark_prompts(spec: ValBenchmark, training_builder: PromptBuilder) -> list[Prompt]:
    """``spec``'s problems as prompts, tagged ``meta["val_set"] = spec.key`` and ``task`` = its verifier."""
    instruction = get_task(spec.task).instruction if spec.instruction is None else spec.instruction
    builder = dataclasses.replace(training_builder, instruction=instruction, task=spec.task, on_long_prompt="skip",
                                  stats={"skipped_long_prompts": 0, "truncated_prompts": 0})
    prompts = []
    for record in load_benchmark(spec.name, path=spec.path, limit=spec.limit):
        prompt = builder.build(record.problem, record.gold, f"{spec.key}:{record.uid}",
                               columns=getattr(record, "columns", None), messages=record.messages)
        if prompt is not None:
            prompt.meta[VAL_SET_KEY] = spec.key
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"data.val_benchmarks: {spec.name}: no problem fits data.max_prompt_tokens")
    training_builder.stats["skipped_long_prompts"] += builder.stats["skipped_long_prompts"]
    return prompts
