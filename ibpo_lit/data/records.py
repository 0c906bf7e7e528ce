"""Problem/gold records read from a JSON Lines file, one line at a time.

What is covered:
- GSM8K files (``question``, ``answer`` with a worked solution ending in ``#### N``): the gold is
  the text after the last ``####`` with thousands separators removed (``1,080`` -> ``1080``).
- MATH-500 / AIME style files (``problem``, ``answer`` holding the final answer itself): set
  ``question_key="problem"`` and ``answer_format="plain"``. A plain answer may be a string or an
  integer (AIME stores ints); it is kept as written (LaTeX stays LaTeX).
- Conversational records (TRL's format): the question field may be a list of messages
  ``[{"role": "system"|"user"|"assistant", "content": "..."}]`` instead of a string. Each message
  is checked (an object, a known role, string content that is not blank, at least one user
  message); ``Record.messages`` keeps them (role and content only) and ``Record.problem`` is
  their text form (`conversation_text`).
- Records without an answer, when no built-in verifier scores them (``answer_required=False``:
  the rewards are functions of the user's own): the gold is None. ``answer_key=None`` reads no
  answer at all.
- Every bad record is reported with the file, the 1-based line number and the field: invalid
  UTF-8, malformed JSON, a line that is not an object, a missing or wrongly typed field, an empty
  question or answer, a GSM8K answer without ``####``, a bad message. Where the likely fix is a
  setting (``question_key`` when the record has a ``prompt`` or ``problem`` field,
  ``answer_format: plain`` for an answer without ``####``), the message says which.
  ``on_bad_record="skip"`` drops such records and collects the errors instead of raising.
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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ibpo_lit.rewards.math import GSM8K_MARKER, extract_gsm8k_gold

AnswerFormat = Literal["gsm8k", "plain"]
BadRecordPolicy = Literal["error", "skip"]
ANSWER_FORMATS = ("gsm8k", "plain")
BAD_RECORD_POLICIES = ("error", "skip")
ROLES = ("system", "user", "assistant")  # TRL's conversational roles
# Field names other data sets give the problem (TRL: "prompt"; MATH: "problem"): a record that
# lacks the configured question field but has one of these gets a hint naming the setting.
QUESTION_FIELD_NAMES = ("prompt", "problem", "question", "query")


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
    problem: str  # the question text, stripped (a conversation's text form, `conversation_text`)
    gold: str | None  # the final answer, as the verifier expects it; None: the record has none
    uid: str  # "<file name>:<line>" (JSONL), "<file or dataset name>:<row>" (other tables)
    # Every field but the question, as read (the answer field raw, not the gold): `Prompt.columns`.
    columns: dict = field(default_factory=dict, compare=False, hash=False)
    # A conversational question: its messages, each {"role", "content"}; None for a string question.
    messages: list[dict] | None = field(default=None, hash=False)


@dataclass(frozen=True)
class RecordFormat:
    """Which fields hold the problem and the answer, and how the answer is written.

    Args:
        question_key: Field holding the problem: a string, or a list of chat messages.
        answer_key: Field holding the answer; None: the records have no answer (only with
            ``answer_required=False``).
        answer_format: "gsm8k" (a solution ending in "#### N") or "plain" (the answer itself).
        answer_required: False when no built-in verifier scores the records (the rewards are
            functions of the user's own): a record without the answer gets gold None.
        settings: How error messages name these settings: "data." (training's YAML keys,
            ``data.answer_format: plain``) or "--" (the evaluate command's options,
            ``--answer_format plain``).
    """

    question_key: str = "question"
    answer_key: str | None = "answer"
    answer_format: AnswerFormat = "gsm8k"
    answer_required: bool = True
    settings: Literal["data.", "--"] = field(default="data.", compare=False)

    def __post_init__(self) -> None:
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {self.answer_format!r}")
        if not self.question_key:
            raise ValueError("question_key must be a non-empty string")
        if self.answer_key is not None and not self.answer_key:
            raise ValueError("answer_key must be a non-empty string, or None for records without an answer")
        if self.answer_key is None and self.answer_required:
            raise ValueError("answer_key=None (records without an answer) needs answer_required=False")

    def setting(self, name: str, value: str | None = None) -> str:
        """The setting ``name`` as the user writes it: ``data.answer_format: plain`` or
        ``--answer_format plain``."""
        if self.settings == "--":
            return f"--{name}" + ("" if value is None else f" {value}")
        return f"data.{name}" + ("" if value is None else f": {value}")

    def missing_answer_hint(self) -> str:
        """Why a record needs its answer, and what to set (training and evaluate differ)."""
        if self.settings == "--":
            return (f"the math verifier scores each response against it: set {self.setting('answer_key')} "
                    f"to the field that holds the answer")
        return (f"the built-in verifiers (math, code) score each response against it: set "
                f"{self.setting('answer_key')} to the field that holds the answer, or score with a reward "
                f"function of your own (model.reward: package.module:function), which needs none")


def parse_record(raw: bytes, path: Path | str, line: int, fmt: RecordFormat) -> Record:
    """Turn one raw JSONL line into a `Record`, or raise `BadRecordError`."""
    return record_from_fields(parse_json_object(raw, path, line), fmt, path, line=line)


def parse_json_object(raw: bytes, path: Path | str, line: int) -> dict:
    """One raw JSONL line as a JSON object, or `BadRecordError` naming the line and what is wrong."""
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
    return obj


def json_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` of a JSONL file's non-blank lines (a UTF-8 BOM dropped).

    JSONL is read here rather than by ``datasets`` (which reads the other formats, `tables`):
    ``on_bad_record: skip`` needs to drop one bad line and go on, and an error must name the
    line, where ``datasets`` parses the file whole and stops at the first bad line without
    naming it. Code benchmarks' files are read through here too (`code_tasks`).

    Raises:
        FileNotFoundError: the file does not exist (or is a directory).
    """
    path = Path(path)
    if not path.is_file():
        if path.is_dir():
            raise FileNotFoundError(f"{path} is a directory, not a JSONL file")
        raise FileNotFoundError(f"no such JSONL file: {path}")
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            if raw.strip():
                yield line_no, raw.rstrip(b"\r\n")


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
    messages = None
    if question is None:
        raise bad(qk, "missing" + _question_hint(obj, fmt))
    if isinstance(question, list):
        messages = parse_messages(question, lambda reason: bad(qk, reason))
        question = conversation_text(messages)
    elif not isinstance(question, str):
        raise bad(qk, f"expected a string or a list of messages, got {type(question).__name__}")
    if not question.strip():
        raise bad(qk, "empty question")

    answer = None if ak is None else obj.get(ak)
    if answer is None and fmt.answer_required:
        raise bad(ak, f"missing ({_fields(obj)}; {fmt.missing_answer_hint()})")
    gold = None if answer is None else _gold(answer, fmt, lambda reason: bad(ak, reason))
    if uid is None:
        uid = f"{Path(path).name}:{line if row is None else row}"
    columns = {k: v for k, v in obj.items() if k != qk}
    return Record(problem=question.strip(), gold=gold, uid=uid, columns=columns, messages=messages)


def _gold(answer, fmt: RecordFormat, bad) -> str:
    """The gold of an answer field's value, or raise ``bad(reason)``."""
    if fmt.answer_format == "plain" and isinstance(answer, int) and not isinstance(answer, bool):
        answer = str(answer)
    plain = fmt.setting("answer_format", "plain")
    if not isinstance(answer, str):
        if fmt.answer_format == "gsm8k" and isinstance(answer, int) and not isinstance(answer, bool):
            raise bad(f"expected a string, got int (an integer is the final answer itself, as in AIME: set {plain})")
        allowed = "a string" if fmt.answer_format == "gsm8k" else "a string or an integer"
        raise bad(f"expected {allowed}, got {type(answer).__name__}")
    if fmt.answer_format == "gsm8k":
        if GSM8K_MARKER not in answer:
            raise bad(f"no {GSM8K_MARKER!r} before the final answer (if this field holds the final answer "
                      f"itself, as in MATH-500 or AIME, set {plain})")
        gold = extract_gsm8k_gold(answer)
    else:
        gold = answer.strip()
    if not gold:
        raise bad("empty final answer")
    return gold


def _fields(obj: dict) -> str:
    return f"the record has fields [{', '.join(map(str, obj))}]"


def _question_hint(obj: dict, fmt: RecordFormat) -> str:
    """`` (the record has fields [...]: set data.question_key: prompt)`` when the record holds a
    field other data sets put the problem in; "" otherwise (a record that simply lacks it)."""
    found = next((name for name in QUESTION_FIELD_NAMES if name != fmt.question_key and obj.get(name) is not None),
                 None)
    if found is None:
        return ""
    return f" ({_fields(obj)}: set {fmt.setting('question_key', found)})"


def parse_messages(value: list, bad) -> list[dict]:
    """A conversational question (TRL's ``[{"role": ..., "content": ...}]``) checked, each message
    reduced to its role and content (a table's other message keys, often None, are not passed to
    the chat template); ``bad(reason)`` builds the error naming the record and field."""
    if not value:
        raise bad("empty list of messages")
    messages = []
    for i, message in enumerate(value, start=1):
        if not isinstance(message, dict):
            raise bad(f"message {i}: expected an object with 'role' and 'content', got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise bad(f"message {i}: 'role' must be one of {', '.join(map(repr, ROLES))}, got {role!r}")
        if not isinstance(content, str):
            raise bad(f"message {i} ({role}): 'content' must be a string, got {type(content).__name__}")
        if not content.strip():
            raise bad(f"message {i} ({role}): empty content")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "user" for m in messages):
        raise bad("no message with role 'user'")
    return messages


def conversation_text(messages: list[dict]) -> str:
    """The text form of a conversation (``Record.problem``: what reward functions get as
    ``prompts``, what correction prompts and samples show): a lone user message is its content,
    as a string question would be; several turns are ``User: ...``, ``Assistant: ...`` paragraphs.
    System messages are left out (the prompt's system prompt carries them)."""
    turns = [m for m in messages if m["role"] != "system"]
    if len(turns) == 1 and turns[0]["role"] == "user":
        return turns[0]["content"].strip()
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content'].strip()}" for m in turns)


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
    lines = json_lines(path)
    yield from kept_records((lambda item=item: parse_record(item[1], path, item[0], fmt) for item in lines),
                            path, on_bad_record, skipped)


def kept_records(parsed: Iterable[Callable[[], Record]], where: Path | str, on_bad_record: BadRecordPolicy,
                 skipped: list[BadRecordError] | None = None) -> Iterator[Record]:
    """The bad-record policy, one rule for every reader (JSONL lines, table rows): each item of
    ``parsed`` makes one record or raises `BadRecordError`; "error" re-raises it, "skip" drops it
    (into ``skipped``). No record at all is an error either way, naming ``where``."""
    n_good = n_bad = 0
    for parse in parsed:
        try:
            record = parse()
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
        raise BadRecordError(where, 0, None, f"no records in {where}{detail}")
