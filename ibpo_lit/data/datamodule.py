"""`PromptDataModule`: the training prompts, from a file, a `datasets` dataset, or synthetic arithmetic.

What is covered:
- Arguments validated in ``__init__`` (a `ValueError` naming the field) so a bad config fails
  before any model loads; the data (JSONL, JSON, Parquet, Arrow, a saved dataset or a `datasets`
  name: `ibpo_lit.data.tables`, docs/data.md) is read and every record checked in `setup`, so a
  bad record on line 7000 stops the run before training, not an hour into it.
- Every prompt carries its record's other fields as ``Prompt.columns`` (what reward functions
  get): a file's or dataset's columns but the question; ``{"answer": gold}`` for arithmetic;
  ``task_id``, ``tests``, ``entry_point``, ``reference`` for code benchmarks.
- The train loader yields lists of ``prompts_per_step`` `Prompt` objects, forever; with
  ``steps_ahead: 1``, `StepPrompts` ``(now, ahead)``: each step's prompts and the next step's
  (`ibpo_lit.data.lookahead`, for one step off-policy generation), only ``now`` consumed.
- Counters for logging in `stats`: ``skipped_records`` (bad JSONL records, counted once at
  setup), ``skipped_long_prompts`` and ``truncated_prompts`` (counted as prompts are drawn).
- Exact resume: `state_dict` holds the stream position of the last batch the trainer actually
  consumed. It is read in `on_before_batch_transfer`, which sees the batch a training step is
  about to use (Lightning prefetches one batch ahead, so the dataset's own iterator position would
  be one batch too far). A new iterator (next Lightning epoch, resume) continues from there.
- Seeds: the training order's (``seed``, ``arithmetic.seed``; unset: ``seed_everything``'s,
  `ibpo_lit.seeds`) are decided when the data module is built and travel in
  `state_dict`; fitting from a checkpoint of other seeds is refused rather than switching the
  order mid-run. The held-out arithmetic problems do not follow ``seed_everything``.

What is not covered:
- Validation/test loaders (evaluation sets come later).
- With ``num_workers > 0``: resume is approximate and the long-prompt counters stay in the worker
  processes (see `ibpo_lit.data.stream`).
- The LightningModule must not override ``on_before_batch_transfer`` too: Lightning would then
  call only this DataModule's hook (and warn).
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import replace
from typing import Any, Literal

import lightning as L
from torch.utils.data import DataLoader

from ibpo_lit.data.arithmetic import ArithmeticConfig, arithmetic_problem, held_out
from ibpo_lit.data.lookahead import LookAheadSteps, StepPrompts, as_is
from ibpo_lit.data.prompt import Prompt, collate_prompts
from ibpo_lit.data.prompt_builder import LONG_PROMPT_POLICIES, PromptBuilder
from ibpo_lit.data.records import (
    ANSWER_FORMATS,
    BAD_RECORD_POLICIES,
    BadRecordError,
    Record,
    RecordFormat,
)
from ibpo_lit.data.stream import (
    ArithmeticSource,
    ProblemSource,
    PromptStream,
    RecordSource,
    StreamPosition,
)
from ibpo_lit.data.tables import (
    FILE_FORMATS,
    check_location,
    file_format,
    infer_source,
    load_table_records,
)
from ibpo_lit.data.val_benchmarks import (
    ValBenchmark,
    benchmark_prompts,
    check_unique_names,
)
from ibpo_lit.rewards.builtin import check_gold
from ibpo_lit.seeds import check_resumed_seeds, run_seed, stream_seed
from ibpo_lit.tasks import ANSWER_INSTRUCTION, get_task

logger = logging.getLogger(__name__)

SOURCES = ("arithmetic", "file", "dataset", "jsonl")  # "jsonl": the old name of "file"
DEFAULT_INSTRUCTION = ANSWER_INSTRUCTION  # the math task's


class PromptDataModule(L.LightningDataModule):
    """Training prompts for RL: problems with gold answers, chat-templated and tokenized.

    Args:
        tokenizer: Model name or path whose tokenizer renders and tokenizes the prompts (the CLI
            links it to the model's name).
        source: Where problems come from: "arithmetic" (synthetic, made in code), "file" (a local
            JSONL/JSON/Parquet/Arrow file or a directory saved with ``save_to_disk``, at
            train_path) or "dataset" (a ``datasets.load_dataset`` name at train_path: a hub name
            such as ``openai/gsm8k``, or a local directory of data files). "jsonl" is an alias
            of "file". Unset: from train_path (an existing file or saved dataset, or a known
            extension: "file"; another name: "dataset"), else "arithmetic".
        train_path: The training problems (see source); required unless source is "arithmetic".
        train_format: Format of a "file" source: "jsonl", "json", "parquet" or "arrow"; unset =
            from the extension (a saved dataset directory is "arrow").
        train_config: Configuration name of a "dataset" source (GSM8K's ``main``).
        train_split: Split of a "dataset" source or a saved ``DatasetDict``; unset = ``train``
            (or the only split).
        question_key: Field (column) holding the problem ("problem" for MATH-style data,
            "prompt" for TRL's): a string, or a conversation, a list of messages ``{role:
            system|user|assistant, content}`` rendered with the chat template as given
            (``instruction`` appended to the last user message; ``system_prompt`` only when the
            messages have no system message).
        answer_key: Field (column) holding the answer. Every field but the question reaches the
            reward functions as ``Prompt.columns`` (the answer under its own name, as written).
            With rewards of your own only (``data.task: custom``) a record may lack it (gold
            None); null: the records have no answer at all.
        answer_format: "gsm8k" (the answer is a solution ending in "#### N"; the gold is N with
            commas removed) or "plain" (the field is the final answer itself, as in MATH-500).
        on_bad_record: What to do with a malformed JSONL record: "error" stops with the file, line
            and field; "skip" drops it and counts it in stats["skipped_records"].
        arithmetic: Synthetic arithmetic problems (used when source is "arithmetic").
        prompts_per_step: Prompts per training step (the DataLoader batch size).
        system_prompt: Optional system message, used when the tokenizer has a chat template.
        chat_template_kwargs: Extra variables for the tokenizer's chat template, passed to
            ``apply_chat_template`` (Qwen3: ``{enable_thinking: false}`` turns thinking off).
        instruction: Text appended to every problem (after a blank line); ``""`` for none; unset =
            the task's own (math: answer after ``####``; code: one python block).
        max_prompt_tokens: Longest prompt in tokens, chat template included.
        on_long_prompt: What to do with a longer prompt: "skip" (counted), "truncate" (shorten
            the problem text, keep the template), or "error".
        seed: Seed of the per-epoch shuffle of a file or dataset source (``ibpo_lit.data.stream``);
            the arithmetic stream has its own ``arithmetic.seed``. Unset: ``seed_everything``'s (0
            without it; ``ibpo_lit.seeds``).
        num_workers: DataLoader worker processes; 0 keeps resume exact.
        steps_ahead: Hand each step the next step's prompts too (1), for a rollout engine that
            samples one step ahead (``model.rollout.max_staleness``, which sets it on the
            command line). 0 = each step's prompts only.
        code_format: Read ``train_path``/``val_path`` as a code benchmark: ``humaneval``,
            ``mbpp``, ``mbpp_sanitized`` or ``livecodebench`` (needs ``model.reward: code``, the
            sandbox).
        code_split: MBPP split trained on (``train``, ``validation``, ``test``, ``prompt``);
            unset = the whole file.
        code_val_split: The split of ``val_path`` validated on.
        code_shown_tests: MBPP asserts shown in the problem text (the rest stay hidden);
            unset = all, the benchmark's own format.
        task: What kind of problems these are (``ibpo_lit.tasks``: ``math``, ``code``, or
            ``custom`` when every reward is a function of your own, ``package.module:function``,
            and no gold answer is needed): it sets the default instruction, the correction
            prompts' wording and the verifier. On the command line it follows ``model.reward`` /
            ``model.rewards`` (linked; not set apart).
        val_size: Held-out problems for validation (``val/accuracy``): the first ``val_size``
            records of ``val_path``, or, without it, arithmetic problems from a stream seeded
            apart from training (``arithmetic.seed + 1000003``, with an unset seed as 0 whatever
            ``seed_everything`` is, so every seed of a run validates on the same problems; small
            operand ranges can still repeat a training problem). 0 = no validation, unless
            ``val_path`` is set (then all of it).
        val_path: Validation problems, in any form train_path takes (same fields); read as
            source "file" or "dataset" like train_path (inferred from the path; an arithmetic
            training source infers it too).
        val_format: Format of a val_path file (as train_format).
        val_config: Configuration name of a val_path dataset name.
        val_split: Split of a val_path dataset; unset = ``validation``, else ``test`` (or the
            only split).
        val_batch_size: Validation prompts per batch.
        val_benchmarks: Evaluation benchmarks validated on while training, each a validation
            set of its own logged as ``val/<name>/avg@k`` and ``val/<name>/pass@k`` (k =
            ``model.val_samples``) and scored by its own verifier: e.g. ``[{name: aime25, path:
            aime2025.jsonl}, {name: math500, path: math500.jsonl, limit: 200}]`` while training
            on GSM8K (`ibpo_lit.data.val_benchmarks.ValBenchmark`).
    """

    def __init__(
        self,
        tokenizer: str = "tiny-llama",
        source: Literal["arithmetic", "file", "dataset", "jsonl"] | None = None,
        train_path: str | None = None,
        train_format: Literal["jsonl", "json", "parquet", "arrow"] | None = None,
        train_config: str | None = None,
        train_split: str | None = None,
        question_key: str = "question",
        answer_key: str | None = "answer",
        answer_format: Literal["gsm8k", "plain"] = "gsm8k",
        on_bad_record: Literal["error", "skip"] = "error",
        arithmetic: ArithmeticConfig = ArithmeticConfig(),
        prompts_per_step: int = 2,
        system_prompt: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        instruction: str | None = None,
        max_prompt_tokens: int = 512,
        on_long_prompt: Literal["truncate", "skip", "error"] = "skip",
        seed: int | None = None,
        num_workers: int = 0,
        steps_ahead: int = 0,
        task: str = "math",
        val_size: int = 0,
        val_path: str | None = None,
        val_format: Literal["jsonl", "json", "parquet", "arrow"] | None = None,
        val_config: str | None = None,
        val_split: str | None = None,
        val_batch_size: int = 8,
        val_benchmarks: list[ValBenchmark] | None = None,
        code_format: str | None = None,
        code_split: str | None = None,
        code_val_split: str | None = None,
        code_shown_tests: int | None = None,
    ):
        super().__init__()
        if source is None:  # `--data.train_path FILE` alone means: train on that file
            source = infer_source(train_path) if train_path else "arithmetic"
        _check_choice("source", source, SOURCES)
        if source == "jsonl":
            source = "file"
        _check_choice("answer_format", answer_format, ANSWER_FORMATS)
        _check_choice("on_bad_record", on_bad_record, BAD_RECORD_POLICIES)
        _check_choice("on_long_prompt", on_long_prompt, LONG_PROMPT_POLICIES)
        for name, value in (("train_format", train_format), ("val_format", val_format)):
            if value is not None:
                _check_choice(name, value, FILE_FORMATS)
        if source != "arithmetic":
            if not train_path:
                raise ValueError(f"data.train_path is required when data.source={source!r}")
            check_location(train_path, source, train_format, train_config, "data.train_path")
        else:
            for name, value in (("train_path", train_path), ("train_format", train_format),
                                ("train_config", train_config), ("train_split", train_split)):
                if value is not None:
                    raise ValueError(f"data.{name} is only read when data.source is 'file' or 'dataset' "
                                     f"(data.source='arithmetic')")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise ValueError("data.chat_template_kwargs must be a mapping, "
                             f"got {type(chat_template_kwargs).__name__}")
        for name, value, low in (("prompts_per_step", prompts_per_step, 1),
                                 ("max_prompt_tokens", max_prompt_tokens, 1),
                                 ("num_workers", num_workers, 0)):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if not isinstance(arithmetic, ArithmeticConfig):
            raise ValueError(f"arithmetic must be an ArithmeticConfig, got {type(arithmetic).__name__}")
        kind = get_task(task)  # ValueError listing the valid names
        if answer_key is None and kind.needs_gold:
            raise ValueError(
                f"data.answer_key: null (records without an answer) leaves the {task!r} verifier nothing to score "
                "responses against: set data.answer_key to the field with the answer, or score with a reward "
                "function of your own (model.reward: package.module:function)")
        if steps_ahead not in (0, 1) or (steps_ahead and num_workers):
            raise ValueError(f"data.steps_ahead must be 0 or 1, and 1 only with data.num_workers: 0 (its resume "
                             f"must be exact), got steps_ahead={steps_ahead}, num_workers={num_workers}")
        if val_size < 0 or val_batch_size < 1:
            raise ValueError(f"data.val_size must be >= 0 and data.val_batch_size >= 1, got {val_size}, {val_batch_size}")
        val_source = None
        if val_path is not None:
            val_source = infer_source(val_path)
            check_location(val_path, val_source, val_format, val_config, "data.val_path")
        elif any(v is not None for v in (val_format, val_config, val_split)):
            raise ValueError("data.val_format/val_config/val_split are only read with data.val_path")
        self.record_format = RecordFormat(question_key, answer_key, answer_format,
                                          answer_required=kind.needs_gold)
        if code_format is not None:
            from ibpo_lit.data.code_tasks import CODE_LOADERS

            _check_choice("code_format", code_format, tuple(CODE_LOADERS))
            if not kind.runs_programs:
                raise ValueError(f"data.code_format={code_format!r} needs the code verifier: model.reward: code "
                                 f"(the data's task follows it; got {task!r})")
        if code_format is not None and any(v is not None for v in (train_config, train_split, val_config,
                                                                    val_split)):
            raise ValueError("data.code_format reads a code benchmark's JSONL file; "
                             "data.train_config/train_split/val_config/val_split do not apply (see data.code_split)")
        if code_format is not None:
            for key, path, src, fmt in (("train", train_path, source, train_format),
                                        ("val", val_path, val_source, val_format)):
                if path is not None and (src != "file" or file_format(path, fmt, f"data.{key}_path") != "jsonl"):
                    raise ValueError(f"data.code_format reads a benchmark's JSONL file; "
                                     f"data.{key}_path is not one: {path}")
        self.code_format, self.code_split, self.code_val_split = code_format, code_split, code_val_split
        self.code_shown_tests = code_shown_tests

        self.tokenizer_name = tokenizer
        self.source = source
        self.train_path = train_path
        self.train_format, self.train_config, self.train_split = train_format, train_config, train_split
        self.on_bad_record = on_bad_record
        self.arithmetic = arithmetic  # as configured: the held-out problems follow its own seed only
        self.prompts_per_step = prompts_per_step
        self.system_prompt = system_prompt
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.instruction = kind.instruction if instruction is None else instruction
        self.max_prompt_tokens = max_prompt_tokens
        self.on_long_prompt = on_long_prompt
        # The training order's seeds, decided once, here (`stream_seed`: the setting, else
        # seed_everything's); a checkpoint records them and a resume under others is refused.
        run = run_seed()
        self.seed = stream_seed(seed, run)
        self.arithmetic_seed = stream_seed(arithmetic.seed, run)
        self.num_workers = num_workers
        self.steps_ahead = steps_ahead
        self.task = task
        self.val_size = val_size
        self.val_path = val_path
        self.val_source, self.val_format = val_source, val_format
        self.val_config, self.val_split = val_config, val_split
        self.val_batch_size = val_batch_size
        self.val_benchmarks = list(val_benchmarks or [])
        check_unique_names(self.val_benchmarks)

        self.tokenizer_obj: Any = None  # set before setup() to skip loading (tests, notebooks)
        self.skipped_record_errors: list[BadRecordError] = []
        self._source: ProblemSource | None = None
        self._builder: PromptBuilder | None = None
        self._dataset: PromptStream | None = None
        self._position = StreamPosition()
        self._restored_stats: dict[str, int] = {}

    # ---- stages -------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self._builder is not None:
            return
        if self.tokenizer_obj is None:
            from ibpo_lit.models.loading import load_tokenizer

            self.tokenizer_obj = load_tokenizer(self.tokenizer_name)
        self._source = self._make_source()
        self._builder = PromptBuilder(
            tokenizer=self.tokenizer_obj,
            instruction=self.instruction,
            system_prompt=self.system_prompt,
            max_prompt_tokens=self.max_prompt_tokens,
            on_long_prompt=self.on_long_prompt,
            task=self.task,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        for key in self._builder.stats:
            self._builder.stats[key] += self._restored_stats.get(key, 0)

    def _make_source(self) -> ProblemSource:
        if self.source == "arithmetic":
            return ArithmeticSource(replace(self.arithmetic, seed=self.arithmetic_seed))
        self.skipped_record_errors = []
        if self.code_format is not None:
            return RecordSource(self._code_records(self.train_path, self.code_split), seed=self.seed)
        records = list(load_table_records(
            self.train_path, self.source, self.record_format, file_fmt=self.train_format,
            config=self.train_config, split=self.train_split, on_bad_record=self.on_bad_record,
            skipped=self.skipped_record_errors, role="train"))
        if self.skipped_record_errors:
            logger.warning("skipped %d bad records in %s; first: %s", len(self.skipped_record_errors),
                           self.train_path, self.skipped_record_errors[0])
        for r in records:  # a gold of a kind the task's verifier is not for: a data error, found at load
            check_gold(get_task(self.task).reward, r.gold, where=r.uid)
        return RecordSource(records, seed=self.seed)

    def _code_records(self, path: str, split: str | None) -> list[Record]:
        """Records of a code benchmark file (gold = the sandbox's test spec, ``REWARDS["code"]``);
        columns: ``task_id``, ``tests`` (the list the sandbox runs), ``entry_point`` and
        ``reference`` (the benchmark's solution) where the benchmark has them."""
        from ibpo_lit.data.code_tasks import load_code_tasks

        kwargs = {"split": split, "shown_tests": self.code_shown_tests}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        records = []
        for task in load_code_tasks(self.code_format, path, **kwargs):
            columns = {"task_id": task.uid, "tests": list(task.tests), "entry_point": task.entry_point,
                       "reference": task.reference}
            columns = {k: v for k, v in columns.items() if v is not None}
            records.append(Record(problem=task.problem, gold=task.gold, uid=task.uid, columns=columns))
        return records

    def train_dataset(self) -> PromptStream:
        if self._builder is None:
            raise RuntimeError("call setup() before asking for the train data")
        trainer = getattr(self, "trainer", None)
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        self._dataset = PromptStream(self._source, self._builder, start=self._position, rank=rank,
                                     world_size=world, per_rank=self.prompts_per_step)
        return self._dataset

    def train_dataloader(self) -> DataLoader:
        if self.steps_ahead:  # whole steps, (now, ahead): the DataLoader batches nothing
            return DataLoader(LookAheadSteps(self.train_dataset(), self.prompts_per_step), batch_size=None,
                              collate_fn=as_is)
        return DataLoader(
            self.train_dataset(),
            batch_size=self.prompts_per_step,
            collate_fn=collate_prompts,
            num_workers=self.num_workers,
        )

    def val_prompts(self) -> list[Prompt]:
        """The fixed held-out prompts (empty when validation is off)."""
        if self._builder is None:
            raise RuntimeError("call setup() before asking for the validation data")
        if self.val_path is not None and self.code_format is not None:
            records = self._code_records(self.val_path, self.code_val_split)
        elif self.val_path is not None:
            records = load_table_records(
                self.val_path, self.val_source, self.record_format, file_fmt=self.val_format,
                config=self.val_config, split=self.val_split, on_bad_record=self.on_bad_record, role="val")
        elif self.val_size > 0:
            stream = held_out(self.arithmetic)
            records = (Record(text, gold, f"val-arithmetic:{i}", {"answer": gold})
                       for i, (text, gold) in ((i, arithmetic_problem(i, stream)) for i in itertools.count()))
        else:
            return []
        prompts = []
        for r in records:
            if self.val_size and len(prompts) >= self.val_size:
                break
            check_gold(get_task(self.task).reward, r.gold, where=r.uid)
            prompt = self._builder.build(r.problem, r.gold, r.uid, r.columns, r.messages)
            if prompt is not None:
                prompts.append(prompt)
        return prompts

    def val_dataloader(self) -> DataLoader | list:
        """The held-out prompts (if any), then one loader per ``val_benchmarks`` entry."""
        sets = [self.val_prompts()] + [benchmark_prompts(spec, self._builder) for spec in self.val_benchmarks]
        loaders = [DataLoader(prompts, batch_size=self.val_batch_size, collate_fn=collate_prompts, shuffle=False)
                   for prompts in sets if prompts]
        if len(loaders) <= 1:
            return loaders[0] if loaders else []
        return loaders

    # ---- counters and resume ------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, int]:
        """Counters for logging: skipped_records, skipped_long_prompts, truncated_prompts."""
        long = self._builder.stats if self._builder is not None else {
            "skipped_long_prompts": self._restored_stats.get("skipped_long_prompts", 0),
            "truncated_prompts": self._restored_stats.get("truncated_prompts", 0),
        }
        return {"skipped_records": len(self.skipped_record_errors), **long}

    @property
    def position(self) -> StreamPosition:
        """Stream position after the last consumed batch (where a resume starts)."""
        return self._position

    def mark_consumed(self, batch: list[Prompt]) -> None:
        """Record that ``batch`` was used; a new iterator or a checkpoint resumes after it."""
        positions = [StreamPosition(**p.meta["stream_position"]) for p in batch
                     if isinstance(p, Prompt) and "stream_position" in p.meta]
        if positions:
            self._position = max(self._position, *positions)
            if self._dataset is not None:
                self._dataset.start = self._position

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = getattr(self, "trainer", None)
        consumed = batch.now if isinstance(batch, StepPrompts) else batch  # (the next step's: not yet)
        if isinstance(consumed, list) and (trainer is None or trainer.training):
            self.mark_consumed(consumed)
        return batch

    @property
    def seeds(self) -> dict[str, int]:
        """The seeds of the training order, by setting (what a resume must sample with)."""
        return {"data.seed": self.seed, "data.arithmetic.seed": self.arithmetic_seed}

    def state_dict(self) -> dict[str, Any]:
        return {**self._position.as_dict(), "stats": self.stats, "seeds": self.seeds}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        trainer = getattr(self, "trainer", None)
        if trainer is None or trainer.state.fn == "fit":  # (`validate` reads no training order)
            check_resumed_seeds(state_dict.get("seeds"), self.seeds, "training data")
        self._position = StreamPosition(int(state_dict["epoch"]), int(state_dict["index"]))
        if self._dataset is not None:
            self._dataset.start = self._position
        stats = dict(state_dict.get("stats", {}))
        if self._builder is not None:
            for key in self._builder.stats:
                self._builder.stats[key] = stats.get(key, 0)
        else:
            self._restored_stats = stats


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
