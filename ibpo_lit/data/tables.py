"""Where training/validation records come from: a local file, a saved dataset, or a `datasets` name.

What is covered:
- ``source: file``: a local file whose format follows its extension (``.jsonl``, ``.json``,
  ``.parquet``, ``.arrow``) or a directory written by ``Dataset.save_to_disk`` /
  ``DatasetDict.save_to_disk`` (format ``arrow``); ``format`` overrides the extension. JSONL is
  read by our own streaming reader (`ibpo_lit.data.records.read_records`: errors name the line);
  the other formats are read with the ``datasets`` library (JSON: a list of objects or JSON lines).
- ``source: dataset``: anything ``datasets.load_dataset(path, name=config, split=split)`` takes: a
  hub name (``openai/gsm8k``, config ``main``) or a local directory of data files. A name that
  cannot be loaded (no network, a typo) fails with one line naming it.
- Splits: a single file has one split; a dataset with several splits uses ``split`` (unset:
  ``train`` for training; ``validation``, else ``test``, for validation), and an unknown split
  fails listing the ones there are.
- Field mapping and checks as for JSONL (`record_from_fields`), with the 0-based row instead of
  the line; a column absent from the whole table fails once, listing the columns there are, under
  either bad-record policy (it is a config error, not a bad record).
- Every other column travels with the record (`Record.columns` -> `Prompt.columns`) as
  ``datasets`` returns it (strings, numbers, lists, dicts, None).
- Conversational datasets: a question column of chat messages (``[{role, content}]``) is read
  as the conversation (`ibpo_lit.data.records.parse_messages`).
- The evaluate command reads your own data here too (``role="eval"``: errors name ``--path``
  and the ``--question_key``-style options; a dataset's ``test`` split, else ``validation``).

What is not covered:
- Streaming (``IterableDataset``): the table is read whole at setup, like the JSONL file.
- CSV and other ``datasets`` builders by extension (use ``source: dataset`` on a directory).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ibpo_lit.data.records import (
    BAD_RECORD_POLICIES,
    QUESTION_FIELD_NAMES,
    BadRecordError,
    BadRecordPolicy,
    Record,
    RecordFormat,
    kept_records,
    read_records,
    record_from_fields,
)

FILE_FORMATS = ("jsonl", "json", "parquet", "arrow")
TABLE_SOURCES = ("file", "dataset")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
_SAVED_MARKERS = ("state.json", "dataset_dict.json")  # what save_to_disk writes


def is_saved_dataset(path: str | Path) -> bool:
    """A directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return Path(path).is_dir() and any((Path(path) / m).is_file() for m in _SAVED_MARKERS)


def infer_source(path: str) -> str:
    """``file`` for a local file, a saved dataset, or a path with a known extension (which then
    fails as missing); ``dataset`` for any other name (a hub name, a directory of data files)."""
    p = Path(path)
    if p.is_file() or is_saved_dataset(p) or p.suffix.lower() in _EXTENSIONS:
        return "file"
    return "dataset"


def path_key(role: str) -> str:
    """The setting that holds a table's location: ``data.train_path``, ``data.val_path``, or the
    evaluate command's ``--path`` (``role="eval"``)."""
    return "--path" if role == "eval" else f"data.{role}_path"


def file_format(path: str, fmt: str | None, key: str = "data.train_path") -> str:
    """The format of a ``source: file`` path: ``fmt`` when given, else from the extension."""
    fmt_key = key.replace("_path", "_format")
    if fmt is not None:
        if fmt not in FILE_FORMATS:
            raise ValueError(f"{fmt_key} must be one of {FILE_FORMATS}, got {fmt!r}")
        return fmt
    if is_saved_dataset(path):
        return "arrow"
    found = _EXTENSIONS.get(Path(path).suffix.lower())
    if found is None:
        # The evaluate command has no format option: the extension is the only way to say it.
        fix = (f"set {fmt_key} to one of {FILE_FORMATS}" if key.startswith("data.")
               else f"name it with one of the extensions {', '.join(_EXTENSIONS)}")
        raise ValueError(f"{key}: cannot tell the format of {path} from its extension; {fix}")
    return found


def check_location(path: str, source: str, fmt: str | None, config: str | None,
                   key: str = "data.train_path") -> None:
    """Config-time checks (no data read): a local file exists and its format is known."""
    if source == "dataset":
        if fmt is not None:
            raise ValueError(f"{key.replace('_path', '_format')} is for data.source: file; "
                             f"a datasets name's format is the dataset's own")
        p = Path(path)
        if p.is_dir() and next((f for f in p.rglob("*") if f.is_file()), None) is None:
            raise FileNotFoundError(f"{key}: is a directory with no data files: {path}")
        return
    if config is not None:
        raise ValueError(f"{key.replace('_path', '_config')} is for data.source: dataset (a datasets name)")
    p = Path(path)
    if not (p.is_file() or is_saved_dataset(p)):
        what = ("is a directory but not a saved dataset (use data.source: dataset for a directory of data files)"
                if p.is_dir() else "no such file")
        raise FileNotFoundError(f"{key}: {what}: {path}")
    fmt = file_format(path, fmt, key)
    if p.is_dir() and fmt != "arrow":
        raise ValueError(f"{key}: {path} is a saved dataset (Arrow), not {fmt}")


def load_table_records(
    path: str,
    source: str,
    fmt: RecordFormat = RecordFormat(),
    file_fmt: str | None = None,
    config: str | None = None,
    split: str | None = None,
    on_bad_record: BadRecordPolicy = "error",
    skipped: list[BadRecordError] | None = None,
    role: str = "train",
) -> Iterator[Record]:
    """The records at ``path`` (see the module docstring), checked like JSONL records.

    Args:
        path: A file, a saved dataset directory, or a ``datasets`` name.
        source: "file" or "dataset".
        fmt: Field names and answer format.
        file_fmt: One of `FILE_FORMATS` (``source: file``); unset: from the extension.
        config: The dataset's configuration name (``source: dataset``), e.g. GSM8K's ``main``.
        split: The split; unset: see the module docstring.
        on_bad_record: "error" raises at the first bad record; "skip" drops it into ``skipped``.
        skipped: Collects the errors of skipped records.
        role: "train", "val" or "eval" (the evaluate command): names the settings in errors and
            picks the default split.
    """
    if on_bad_record not in BAD_RECORD_POLICIES:
        raise ValueError(f"on_bad_record must be one of {BAD_RECORD_POLICIES}, got {on_bad_record!r}")
    key = path_key(role)
    if source == "file" and file_format(path, file_fmt, key) == "jsonl":
        yield from read_records(path, fmt, on_bad_record, skipped)
        return
    table, name = _load_table(path, source, file_fmt, config, split, role)
    _check_columns(table.column_names, fmt, name)
    rows = ((lambda row=row, obj=obj: record_from_fields(obj, fmt, name, row=row, uid=f"{name}:{row}"))
            for row, obj in enumerate(table))
    yield from kept_records(rows, name, on_bad_record, skipped)


def _check_columns(columns: list[str], fmt: RecordFormat, name: str) -> None:
    """A question or (needed) answer column absent from the whole table: one error, under either
    bad-record policy, listing the columns there are and, where one looks like the question
    (``prompt``, ``problem``, ...), the setting to write."""
    wanted = [fmt.question_key] + ([fmt.answer_key] if fmt.answer_key is not None and fmt.answer_required else [])
    missing = [k for k in wanted if k not in columns]
    if not missing:
        return
    which = " and ".join(repr(k) for k in missing)
    if missing == [fmt.answer_key]:  # the question is there: say why the answer is needed
        fix = fmt.missing_answer_hint()
    else:
        found = next((c for c in QUESTION_FIELD_NAMES if c in columns), None)
        fix = "set " + " / ".join([fmt.setting("question_key", found) if found else fmt.setting("question_key")]
                                  + [fmt.setting("answer_key")] * (len(missing) - 1))
    raise BadRecordError(name, 0, None, f"{name}: no column {which} (columns: {', '.join(columns)}); {fix}")


def _load_table(path: str, source: str, file_fmt: str | None, config: str | None, split: str | None,
                role: str):
    """``(datasets.Dataset, name for uids and errors)``."""
    import datasets

    key = path_key(role)
    fmt = file_format(path, file_fmt, key) if source == "file" else None
    name = Path(path).name if source == "file" else (path if config is None else f"{path}:{config}")
    try:
        if source == "dataset":
            loaded = datasets.load_dataset(path, name=config, split=split)  # split None: all of them
        elif Path(path).is_dir():
            loaded = datasets.load_from_disk(path)
        elif fmt == "arrow":
            loaded = datasets.Dataset.from_file(path)
        else:
            loaded = datasets.load_dataset(fmt, data_files=str(path), split="train")
    except Exception as e:  # network, a missing dataset or split, a file datasets cannot parse
        hint = " (no local file or directory of that name either)" if not Path(path).exists() else ""
        raise ValueError(f"{key}: cannot load {path!r}{hint}: {type(e).__name__}: {_one_line(e)}") from None
    if source == "dataset" and split is not None:
        return loaded, f"{name}/{split}"
    if isinstance(loaded, datasets.DatasetDict):
        chosen = split or _default_split(list(loaded), role)
        if chosen not in loaded:
            fix = "" if role == "eval" else f"; set data.{role}_split"  # evaluate reads the test split
            raise ValueError(f"{key}: {path!r} has no split {chosen!r} (splits: {', '.join(loaded)}){fix}")
        return loaded[chosen], f"{name}/{chosen}"
    return loaded, name


def _default_split(splits: list[str], role: str) -> str:
    if len(splits) == 1:
        return splits[0]
    if role == "train":
        return "train"
    if role == "eval":  # a benchmark is its test split
        return "test" if "test" in splits or "validation" not in splits else "validation"
    return "validation" if "validation" in splits else "test"


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
