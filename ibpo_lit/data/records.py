"""Problem/gold records read from a JSON Lines file, one line at a time.

What is covered:
- GSM8K files (``question``, ``answer`` with a worked solution ending in ``#### N``): the gold is
  the text after the last ``####`` with thousands separators removed (``1,080`` -> ``1080``).
- MATH-500 / AIME style files (``problem``, ``answer`` holding the final answer itself): set
  ``question_key="problem"`` and ``answer_format="plain"``. A plain answer may be a string or an
  integer (AIME stores ints); it is kept as written (LaTeX stays LaTeX).
- Every bad record is reported with the file, the 1-based line number and the field: invalid
  UTF-8, malformed JSON, a line that is not an object, a missing or wrongly typed field, an empty
  question or answer, a GSM8K answer without ``####``. ``on_bad_record="skip"`` drops such records
  and collects the errors instead of raising.
- A file with no usable record raises (``no records in FILE``).
- A UTF-8 byte-order mark at the start of the file is ignored (editors on Windows write one).

What is not covered:
- Whitespace-only lines are ignored rather than reported (a trailing newline is common).
- GSM8K calculator annotations ``<<expr=value>>`` are left in the solution text; only the gold is
  extracted here.
"""
from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ibpo_lit.rewards.math import GSM8K_MARKER, extract_gsm8k_gold

AnswerFormat = Literal["gsm8k", "plain"]
BadRecordPolicy = Literal["error", "skip"]
ANSWER_FORMATS = ("gsm8k", "plain")
BAD_RECORD_POLICIES = ("error", "skip")


class BadRecordError(ValueError):
    """A record that cannot be used; the message names the file, the line (JSONL) or the 0-based
    row (any other table, ``row=``), and the field."""

    def __init__(self, path: Path | str, line: int, field: str | None, reason: str, row: int | None = None):
        self.path, self.line, self.field, self.reason, self.row = str(path), line, field, reason, row
        if line == 0 and row is None:  # about the whole file
            super().__init__(reason)
            return
        where = (f"{path}:{line}" if row is None else f"{path}: row {row}") + (f": field {field!r}" if field else "")
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class Record:
    problem: str  # the question text, stripped
    gold: str  # the final answer, as the verifier expects it
    uid: str  # "<file name>:<line>" (JSONL), "<file or dataset name>:<row>" (other tables)
    # Every field but the question, as read (the answer field raw, not the gold): `Prompt.columns`.
    columns: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class RecordFormat:
    """Which fields hold the problem and the answer, and how the answer is written.

    Args:
        question_key: Field holding the problem text.
        answer_key: Field holding the answer.
        answer_format: "gsm8k" (a solution ending in "#### N") or "plain" (the answer itself).
    """

    question_key: str = "question"
    answer_key: str = "answer"
    answer_format: AnswerFormat = "gsm8k"

    def __post_init__(self) -> None:
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {self.answer_format!r}")
        for name in ("question_key", "answer_key"):
            if not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")


def parse_record(raw: bytes, path: Path | str, line: int, fmt: RecordFormat) -> Record:
    """Turn one raw JSONL line into a `Record`, or raise `BadRecordError`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRecordError(path, line, None, f"invalid UTF-8 at byte {e.start}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRecordError(path, line, None, f"malformed JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise BadRecordError(path, line, None, f"expected a JSON object, got {type(obj).__name__}")
    return record_from_fields(obj, fmt, path, line=line)


def record_from_fields(obj: dict, fmt: RecordFormat, path: Path | str, line: int = 0, row: int | None = None,
                       uid: str | None = None) -> Record:
    """One record's fields (a JSON object, a table row) -> `Record`, or raise `BadRecordError`.

    ``line`` (JSONL) or ``row`` (0-based, other tables) says where the record is, in errors and
    in the default uid (``"<file name>:<line or row>"``). A null field counts as missing.
    """

    def bad(field_name: str, reason: str) -> BadRecordError:
        return BadRecordError(path, line, field_name, reason, row=row)

    qk, ak = fmt.question_key, fmt.answer_key
    question = obj.get(qk)
    if question is None:
        raise bad(qk, "missing")
    if not isinstance(question, str):
        raise bad(qk, f"expected a string, got {type(question).__name__}")
    if not question.strip():
        raise bad(qk, "empty question")

    answer = obj.get(ak)
    if answer is None:
        raise bad(ak, "missing")
    if fmt.answer_format == "plain" and isinstance(answer, int) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str):
        allowed = "a string" if fmt.answer_format == "gsm8k" else "a string or an integer"
        raise bad(ak, f"expected {allowed}, got {type(answer).__name__}")
    if fmt.answer_format == "gsm8k":
        if GSM8K_MARKER not in answer:
            raise bad(ak, f"no {GSM8K_MARKER!r} before the final answer")
        gold = extract_gsm8k_gold(answer)
    else:
        gold = answer.strip()
    if not gold:
        raise bad(ak, "empty final answer")
    if uid is None:
        uid = f"{Path(path).name}:{line if row is None else row}"
    columns = {k: v for k, v in obj.items() if k != qk}
    return Record(problem=question.strip(), gold=gold, uid=uid, columns=columns)


def read_records(
    path: str | Path,
    fmt: RecordFormat = RecordFormat(),
    on_bad_record: BadRecordPolicy = "error",
    skipped: list[BadRecordError] | None = None,
) -> Iterator[Record]:
    """Stream the records of a JSONL file, line by line.

    Args:
        path: the JSONL file.
        fmt: field names and answer format.
        on_bad_record: "error" raises `BadRecordError` at the first bad record; "skip" drops it
            and appends the error to ``skipped`` (when given).
        skipped: collects the errors of skipped records.

    Raises:
        FileNotFoundError: the file does not exist.
        BadRecordError: a bad record under ``on_bad_record="error"``, or no usable record at all.
    """
    if on_bad_record not in BAD_RECORD_POLICIES:
        raise ValueError(f"on_bad_record must be one of {BAD_RECORD_POLICIES}, got {on_bad_record!r}")
    path = Path(path)
    if not path.is_file():
        if path.is_dir():
            raise FileNotFoundError(f"{path} is a directory, not a JSONL file")
        raise FileNotFoundError(f"no such JSONL file: {path}")
    n_good = n_bad = 0
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            if not raw.strip():
                continue
            try:
                record = parse_record(raw.rstrip(b"\r\n"), path, line_no, fmt)
            except BadRecordError as e:
                if on_bad_record == "error":
                    raise
                n_bad += 1
                if skipped is not None:
                    skipped.append(e)
                continue
            n_good += 1
            yield record
    if n_good == 0:
        detail = f" ({n_bad} bad records skipped)" if n_bad else ""
        raise BadRecordError(path, 0, None, f"no records in {path}{detail}")
