"""Math benchmarks by name: GSM8K, MATH-500, AIME 2025, HMMT February 2025.

What is covered:
- `BENCHMARKS`: name -> `BenchmarkSpec` (record format, Hugging Face id/config/split, the field
  that holds a stable id). `load_benchmark(name, path=None, limit=None)` returns `Record`s
  (problem, gold, uid) whose gold is what `ibpo_lit.rewards.math_score` expects.
- With ``path``: a local JSON Lines file in the benchmark's upstream format, read and validated by
  `ibpo_lit.data.records.read_records` (errors name the file, line and field):
  ``gsm8k`` / ``gsm8k_train`` (``question``, ``answer`` ending in ``#### N``; gold N, commas
  removed), ``math500`` (``problem``, ``answer`` in LaTeX), ``aime25`` (``problem``, ``answer``
  an int 0-999), ``hmmt25`` (``problem``, ``answer`` a LaTeX string).
- uid: the record's own id where the format has one (``aime2025_I_1``, ``hmmt_feb2025_10``,
  MATH-500's ``test/precalculus/807.json``), else ``<file name>:<line>`` (GSM8K).
- Without ``path``: the Hugging Face hub through the `datasets` library, imported only then.
  `datasets` is not a dependency of ibpo-lit; without it the error says how to proceed. The hub
  rows go through the same record parser, so golds are extracted the same way.

What is not covered:
- The hub code is kept thin and is not tested here (the tests have no network and no
  `datasets`). Hub uids are the id field when the hub rows have one, else
  ``<hub id>/<split>:<row>`` (1-based).
- Prompt formatting, and answer formats beyond math (code benchmarks are another module).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path

from ibpo_lit.data.records import Record, RecordFormat, parse_record, read_records

DATASETS_MISSING = "pip install datasets, or pass --path to a local JSONL file"

_GSM8K = RecordFormat(question_key="question", answer_key="answer", answer_format="gsm8k")
_PLAIN = RecordFormat(question_key="problem", answer_key="answer", answer_format="plain")


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a benchmark lives and how its records are read.

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


BENCHMARKS: dict[str, BenchmarkSpec] = {
    "gsm8k": BenchmarkSpec(_GSM8K, "openai/gsm8k", "test", hub_config="main", size=1319),
    "gsm8k_train": BenchmarkSpec(_GSM8K, "openai/gsm8k", "train", hub_config="main", size=7473),
    "math500": BenchmarkSpec(_PLAIN, "HuggingFaceH4/MATH-500", "test", id_key="unique_id", size=500),
    "aime25": BenchmarkSpec(_PLAIN, "MathArena/aime_2025", "train", id_key="id", size=30),
    "hmmt25": BenchmarkSpec(_PLAIN, "MathArena/hmmt_feb_2025", "train", id_key="id", size=30),
}


def get_benchmark(name: str) -> BenchmarkSpec:
    """The spec registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists the valid names).
    """
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise ValueError(f"unknown benchmark {name!r}; valid names: {sorted(BENCHMARKS)}") from None


def load_benchmark(name: str, path: str | Path | None = None, limit: int | None = None) -> list[Record]:
    """The records of benchmark ``name``, in file order.

    Args:
        name: a key of `BENCHMARKS` ("gsm8k", "gsm8k_train", "math500", "aime25", "hmmt25").
        path: a local JSONL file in the benchmark's format; None loads from the Hugging Face hub.
        limit: keep only the first ``limit`` records (None: all).

    Raises:
        ValueError: unknown name, or ``limit`` < 1.
        FileNotFoundError / BadRecordError: from reading ``path``.
        ImportError: no ``path`` and the `datasets` library is not installed.
    """
    spec = get_benchmark(name)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    if path is None:
        records = _hub_records(spec)
    else:
        records = _file_records(spec, Path(path))
    return list(islice(records, limit))


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


def _hub_records(spec: BenchmarkSpec):
    """Rows from the Hugging Face hub, parsed like file lines. Untested here (no network)."""
    try:
        import datasets
    except ImportError as e:
        raise ImportError(DATASETS_MISSING) from e
    rows = datasets.load_dataset(spec.hub_id, spec.hub_config, split=spec.hub_split)
    source = f"{spec.hub_id}/{spec.hub_split}"
    for i, row in enumerate(rows, start=1):
        raw = json.dumps(dict(row), default=str).encode("utf-8")
        record = parse_record(raw, source, i, spec.fmt)
        record = replace(record, uid=f"{source}:{i}")
        yield _with_id(record, row, spec.id_key) if spec.id_key else record
