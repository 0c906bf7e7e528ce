"""Benchmarks by name: math (GSM8K, MATH-500, AIME 2025, HMMT February 2025) and code
(HumanEval, MBPP full and sanitized, LiveCodeBench).

What is covered:
- `BENCHMARKS`: math name -> `BenchmarkSpec` (record format, Hugging Face id/config/split, the
  field that holds a stable id). `CODE_BENCHMARKS`: code name -> `CodeBenchmarkSpec` (hub id,
  config, whether it has MBPP's splits). `benchmark_task(name)` says which verifier scores a
  benchmark ("math" or "code"). `load_benchmark(name, path=None, limit=None)` returns `Record`s
  (problem, gold, uid) whose gold is what that verifier expects: `ibpo_lit.rewards.math_score`'s
  answer string, or for code `CodeTests.to_gold()` (the tests the sandbox runs).
- With ``path``: a local JSON Lines file in the benchmark's upstream format, read and validated by
  `ibpo_lit.data.records.read_records` (math) or `ibpo_lit.data.code_tasks` (code); errors name
  the file, line and field. Math: ``gsm8k`` / ``gsm8k_train`` (``question``, ``answer`` ending in
  ``#### N``; gold N, commas removed), ``math500`` (``problem``, ``answer`` in LaTeX), ``aime25``
  (``problem``, ``answer`` an int 0-999), ``hmmt25`` (``problem``, ``answer`` a LaTeX string).
  Code: ``humaneval`` (HumanEval.jsonl), ``mbpp`` (mbpp.jsonl), ``mbpp_sanitized``
  (sanitized-mbpp as JSON Lines), ``livecodebench`` (``code_generation_lite`` rows, e.g. v6's
  test6.jsonl); see `ibpo_lit.data.code_tasks` for how each becomes a problem and its tests.
- MBPP's split: ``mbpp_split`` picks MBPP's conventional split by task_id, "test" (11-510) by
  default, as papers report MBPP; "all" keeps the whole file.
- Your own data (the evaluate command's ``--benchmark mydata --path FILE``): `load_own_data`
  reads it with training's table readers (`ibpo_lit.data.tables`: JSONL, JSON, Parquet, Arrow, a
  saved dataset or a ``datasets`` name, its test split) and a `RecordFormat` (training's
  defaults: ``question``, ``answer``, ``gsm8k``; string or conversational questions); it is
  scored by the math verifier (`OWN_DATA_TASK`). ``load_benchmark``'s ``fmt`` overrides a math
  benchmark's own field names and answer format.
- uid: the record's own id where the format has one (``aime2025_I_1``, ``hmmt_feb2025_10``,
  MATH-500's ``test/precalculus/807.json``, ``HumanEval/0``, ``mbpp/11``), else
  ``<file name>:<line>`` (GSM8K).
- Without ``path``: the Hugging Face hub through the `datasets` library, imported only then.
  `datasets` is not a dependency of ibpo-lit; without it the error says how to proceed. The hub
  rows go through the same parsers as file lines (code rows are written to a temporary JSONL
  file and read by the file loader), so golds are extracted the same way.

What is not covered:
- The hub is tested only against a stand-in `datasets` module (the tests have no network).
  Math hub uids are the id field when the hub rows have one, else ``<hub id>/<split>:<row>``
  (1-based). LiveCodeBench has no hub path (its hub dataset needs a release tag and remote
  code): pass its file.
- LiveCodeBench date windows: the file's problems are all evaluated (test6.jsonl is v6 alone).
- Prompt formatting (`ibpo_lit.data.prompt_builder`; code instructions live in
  `ibpo_lit.data.code_tasks`).
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path

from ibpo_lit.data.records import Record, RecordFormat, parse_record, read_records
from ibpo_lit.tasks import DEFAULT_TASK

DATASETS_MISSING = "pip install datasets, or pass --path to a local JSONL file"
MBPP_SPLIT_CHOICES = ("test", "validation", "train", "prompt", "all")  # code_tasks.MBPP_SPLITS + all
DEFAULT_MBPP_SPLIT = "test"

_GSM8K = RecordFormat(question_key="question", answer_key="answer", answer_format="gsm8k")
_PLAIN = RecordFormat(question_key="problem", answer_key="answer", answer_format="plain")


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a math benchmark lives and how its records are read.

    Args:
        fmt: Fields holding the problem and the answer, and the answer format.
        hub_id: Hugging Face dataset id.
        hub_split: Split to load from the hub.
        hub_config: Hub dataset config name, if the dataset has several.
        id_key: Field holding a stable record id, if the format has one (else uid is file:line).
        size: Number of records in the full benchmark (documentation and a sanity check).
    """

    fmt: RecordFormat
    hub_id: str
    hub_split: str
    hub_config: str | None = None
    id_key: str | None = None
    size: int | None = None
    task: str = "math"  # the task (`ibpo_lit.tasks`) whose verifier scores it


@dataclass(frozen=True)
class CodeBenchmarkSpec:
    """Where a code benchmark lives; its file format is the `code_tasks` loader of the same name.

    Args:
        hub_id: Hugging Face dataset id; None when there is no hub path (pass a file).
        hub_config: Hub dataset config name, if the dataset has several.
        hub_split: Split to load from the hub (MBPP: the ``mbpp_split`` asked for instead).
        has_mbpp_splits: Split by task_id as MBPP is (`ibpo_lit.data.code_tasks.MBPP_SPLITS`).
        size: Problems evaluated by default (MBPP: its test split).
    """

    hub_id: str | None
    hub_config: str | None = None
    hub_split: str = "test"
    has_mbpp_splits: bool = False
    size: int | None = None
    task: str = "code"  # the task (`ibpo_lit.tasks`) whose verifier scores it


BENCHMARKS: dict[str, BenchmarkSpec] = {
    "gsm8k": BenchmarkSpec(_GSM8K, "openai/gsm8k", "test", hub_config="main", size=1319),
    "gsm8k_train": BenchmarkSpec(_GSM8K, "openai/gsm8k", "train", hub_config="main", size=7473),
    "math500": BenchmarkSpec(_PLAIN, "HuggingFaceH4/MATH-500", "test", id_key="unique_id", size=500),
    "aime25": BenchmarkSpec(_PLAIN, "MathArena/aime_2025", "train", id_key="id", size=30),
    "hmmt25": BenchmarkSpec(_PLAIN, "MathArena/hmmt_feb_2025", "train", id_key="id", size=30),
}
CODE_BENCHMARKS: dict[str, CodeBenchmarkSpec] = {
    "humaneval": CodeBenchmarkSpec("openai/openai_humaneval", size=164),
    "mbpp": CodeBenchmarkSpec("google-research-datasets/mbpp", "full", has_mbpp_splits=True, size=500),
    "mbpp_sanitized": CodeBenchmarkSpec("google-research-datasets/mbpp", "sanitized", has_mbpp_splits=True,
                                        size=257),
    "livecodebench": CodeBenchmarkSpec(None),
}


# The task of your own data (`load_own_data`): math-verify against the answer field.
OWN_DATA_TASK = DEFAULT_TASK


def _unknown(name: str) -> ValueError:
    return ValueError(f"unknown benchmark {name!r}; valid names: {sorted({*BENCHMARKS, *CODE_BENCHMARKS})}")


def is_benchmark(name: str) -> bool:
    """A registered benchmark (math or code), as opposed to a name for your own data."""
    return name in BENCHMARKS or name in CODE_BENCHMARKS


def get_benchmark(name: str) -> BenchmarkSpec | CodeBenchmarkSpec:
    """The spec registered as ``name`` (math or code).

    Raises:
        ValueError: unknown name (the message lists the valid names).
    """
    spec = BENCHMARKS.get(name) or CODE_BENCHMARKS.get(name)
    if spec is None:
        raise _unknown(name)
    return spec


def benchmark_task(name: str) -> str:
    """The task that scores benchmark ``name`` (``ibpo_lit.tasks``): "math" or "code".

    Raises:
        ValueError: unknown name (the message lists the valid names).
    """
    return get_benchmark(name).task


def check_mbpp_split(name: str, mbpp_split: str) -> None:
    """Reject an MBPP split that is not one, or one asked of a benchmark without MBPP's splits."""
    spec = get_benchmark(name)
    if mbpp_split not in MBPP_SPLIT_CHOICES:
        raise ValueError(f"mbpp_split must be one of {MBPP_SPLIT_CHOICES}, got {mbpp_split!r}")
    if mbpp_split != DEFAULT_MBPP_SPLIT and not getattr(spec, "has_mbpp_splits", False):
        raise ValueError(f"mbpp_split={mbpp_split!r} applies to mbpp and mbpp_sanitized only, not {name!r}")


def load_benchmark(name: str, path: str | Path | None = None, limit: int | None = None,
                   mbpp_split: str = DEFAULT_MBPP_SPLIT, fmt: RecordFormat | None = None) -> list[Record]:
    """The records of benchmark ``name``, in file order.

    Args:
        name: a key of `BENCHMARKS` ("gsm8k", "gsm8k_train", "math500", "aime25", "hmmt25") or of
            `CODE_BENCHMARKS` ("humaneval", "mbpp", "mbpp_sanitized", "livecodebench").
        path: a local JSONL file in the benchmark's format; None loads from the Hugging Face hub.
        limit: keep only the first ``limit`` records (None: all), after the MBPP split.
        mbpp_split: MBPP's split by task_id ("test": 11-510, "validation", "train", "prompt")
            or "all"; other benchmarks take only the default.
        fmt: the record format of a math benchmark; None: the benchmark's own. Code benchmarks
            have their upstream formats.

    Raises:
        ValueError: unknown name, bad ``mbpp_split``, ``limit`` < 1, a ``fmt`` for a code
            benchmark, or LiveCodeBench without path.
        FileNotFoundError / BadRecordError: from reading ``path``.
        ImportError: no ``path`` and the `datasets` library is not installed.
    """
    spec = get_benchmark(name)
    check_mbpp_split(name, mbpp_split)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    if isinstance(spec, CodeBenchmarkSpec):
        if fmt is not None:
            raise ValueError(f"{name!r} is read in its upstream format; a record format applies to math "
                             "benchmarks and your own data")
        return _code_records(name, spec, path, limit, mbpp_split)
    if fmt is not None:
        spec = replace(spec, fmt=fmt)
    if path is None:
        records = _hub_records(spec)
    else:
        records = _file_records(spec, Path(path))
    return list(islice(records, limit))


def load_own_data(path: str, fmt: RecordFormat = RecordFormat(settings="--"), limit: int | None = None) -> list[Record]:
    """Your own evaluation data, read as training reads its data (`ibpo_lit.data.tables`), in order.

    Args:
        path: a JSONL, JSON, Parquet or Arrow file, a directory saved with ``save_to_disk``, or a
            ``datasets`` name (its ``test`` split, else ``validation``, or the only one).
        fmt: field names and answer format (errors name the evaluate command's options by default).
        limit: keep only the first ``limit`` records (None: all).

    Raises:
        ValueError: ``limit`` < 1; FileNotFoundError / BadRecordError / ValueError from reading ``path``.
    """
    from ibpo_lit.data.tables import check_location, infer_source, load_table_records, path_key

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    source = infer_source(path)
    check_location(path, source, None, None, path_key("eval"))
    return list(islice(load_table_records(path, source, fmt, role="eval"), limit))


def _file_records(spec: BenchmarkSpec, path: Path):
    records = read_records(path, spec.fmt)  # validates every line; uid "<file>:<line>"
    if spec.id_key is None:
        yield from records
        return
    # read_records yields exactly one record per non-blank line, in order (bad lines raise).
    with path.open("rb") as f:
        raws = (raw for raw in f if raw.strip())
        for record, raw in zip(records, raws):
            yield _with_id(record, json.loads(raw), spec.id_key)


def _with_id(record: Record, obj: dict, id_key: str) -> Record:
    uid = obj.get(id_key)
    return replace(record, uid=str(uid)) if isinstance(uid, (str, int)) and str(uid) else record


def _load_dataset(hub_id: str, config: str | None, split: str):
    try:
        import datasets
    except ImportError as e:
        raise ImportError(DATASETS_MISSING) from e
    return datasets.load_dataset(hub_id, config, split=split)


def _hub_records(spec: BenchmarkSpec):
    """Rows from the Hugging Face hub, parsed like file lines."""
    rows = _load_dataset(spec.hub_id, spec.hub_config, spec.hub_split)
    source = f"{spec.hub_id}/{spec.hub_split}"
    for i, row in enumerate(rows, start=1):
        raw = json.dumps(dict(row), default=str).encode("utf-8")
        record = parse_record(raw, source, i, spec.fmt)
        record = replace(record, uid=f"{source}:{i}")
        yield _with_id(record, row, spec.id_key) if spec.id_key else record


def _code_records(name: str, spec: CodeBenchmarkSpec, path: str | Path | None, limit: int | None,
                  mbpp_split: str) -> list[Record]:
    from ibpo_lit.data.code_tasks import load_code_tasks  # imports the sandbox's test spec

    kwargs: dict = {"limit": limit}
    if spec.has_mbpp_splits:
        kwargs["split"] = None if mbpp_split == "all" else mbpp_split
    if path is not None:
        return [task.to_record() for task in load_code_tasks(name, path, **kwargs)]
    if spec.hub_id is None:
        raise ValueError(f"benchmark {name!r} has no hub path; pass --path to its JSONL file")
    # The file loaders validate and build the tests; hub rows are written out in the file format.
    splits = [spec.hub_split]
    if spec.has_mbpp_splits:  # the hub's MBPP splits are the task_id ranges
        splits = ["prompt", "test", "validation", "train"] if mbpp_split == "all" else [mbpp_split]
    with tempfile.TemporaryDirectory() as folder:
        rows_path = Path(folder) / f"{name}.jsonl"
        with rows_path.open("w", encoding="utf-8") as f:
            for split in splits:
                for row in _load_dataset(spec.hub_id, spec.hub_config, split):
                    f.write(json.dumps(dict(row), default=str) + "\n")
        return [task.to_record() for task in load_code_tasks(name, rows_path, **kwargs)]
