"""Bad training data through the command line: each kind of bad record stops
``fit --data.train_path FILE`` before any weights load, with the file, the line and the field;
``on_bad_record: skip`` and ``on_long_prompt: truncate`` keep going and count what they dropped
or cut. The record-level rules themselves are tested in test_records.py."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import ibpo_lit.module
from ibpo_lit.__main__ import main
from ibpo_lit.data import PromptDataModule
from ibpo_lit.data.records import BadRecordError, read_records

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")
GOOD = json.dumps({"question": "What is 1 + 2?", "answer": "1 + 2 = 3\n#### 3"})


def _write(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


def _fit(tmp_path, data: Path, *overrides: str, steps: int = 1):
    return main(["fit", "--config", TINY, "--trainer.max_steps", str(steps), "--trainer.default_root_dir",
                 str(tmp_path / "run"), "--trainer.enable_progress_bar", "false", "--data.train_path", str(data),
                 *overrides])


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")  # (tests/conftest.py)


@pytest.fixture
def no_weights(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the bad record was reported")

    monkeypatch.setattr(ibpo_lit.module, "load_policy", refuse)


@pytest.mark.parametrize(
    "bad, field, reason",
    [
        ('{"question": "x", "answer": "#### 1"', None, "malformed JSON"),
        (json.dumps({"answer": "#### 1"}), "question", "missing"),
        (json.dumps({"question": 3, "answer": "#### 1"}), "question",
         "expected a string or a list of messages, got int"),
        (json.dumps({"question": ["x"], "answer": "#### 1"}), "question",
         "message 1: expected an object with 'role' and 'content', got str"),
        (json.dumps({"question": "   ", "answer": "#### 1"}), "question", "empty question"),
        (json.dumps({"question": "x", "answer": 7}), "answer", "expected a string, got int"),
        (b'{"question": "caf\xe9?", "answer": "#### 1"}', None, "invalid UTF-8 at byte 17"),
    ],
    ids=["malformed-json", "missing-field", "wrong-type", "not-messages", "empty-prompt", "wrong-answer-type",
         "invalid-utf8"],
)
def test_a_bad_record_stops_fit_naming_file_line_and_field(tmp_path, no_weights, bad, field, reason):
    data = _write(tmp_path / "train.jsonl", [GOOD, GOOD, bad, GOOD])
    with pytest.raises(BadRecordError) as info:
        _fit(tmp_path, data)
    err = info.value
    assert (err.path, err.line, err.field) == (str(data), 3, field)
    where = f"{data}:3: field {field!r}: " if field else f"{data}:3: "
    assert str(err).startswith(where) and reason in str(err)


def test_an_empty_data_file_stops_fit(tmp_path, no_weights):
    data = _write(tmp_path / "empty.jsonl", [])
    with pytest.raises(BadRecordError, match=f"no records in {data}$"):
        _fit(tmp_path, data)


def test_a_directory_is_not_a_data_file(tmp_path):
    # a directory is read as a datasets directory of data files (docs/data.md); an empty one fails
    with pytest.raises(FileNotFoundError, match=f"data.train_path: is a directory with no data files: {tmp_path}"):
        PromptDataModule(train_path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="is a directory, not a JSONL file"):
        list(read_records(tmp_path))


def test_a_byte_order_mark_is_not_an_error(tmp_path):
    data = _write(tmp_path / "bom.jsonl", [b"\xef\xbb\xbf" + GOOD.encode(), GOOD])
    assert [r.gold for r in read_records(data)] == ["3", "3"]


@pytest.mark.slow
def test_skip_and_truncate_keep_going_and_count(tmp_path):
    long_question = "Count the apples. " * 200 + "What is 2 + 2?"  # far over max_prompt_tokens
    data = _write(tmp_path / "train.jsonl", [
        GOOD,
        "{broken",
        json.dumps({"question": long_question, "answer": "#### 4"}),
        json.dumps({"question": "What is 3 + 1?"}),
        GOOD,
        GOOD,
    ])
    # 4 usable records, 2 steps of 2 prompts: one whole epoch, so the long one is drawn once
    cli = _fit(tmp_path, data, "--data.on_bad_record", "skip", "--data.on_long_prompt", "truncate",
               "--data.max_prompt_tokens", "128", steps=2)
    assert cli.trainer.global_step == 2
    assert cli.datamodule.stats == {"skipped_records": 2, "skipped_long_prompts": 0, "truncated_prompts": 1}
    assert [(e.line, e.field) for e in cli.datamodule.skipped_record_errors] == [(2, None), (4, "answer")]

    # visible: logged every step, and the total skipped on the progress bar
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = next((tmp_path / "run" / "lightning_logs" / "version_0").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events))
    acc.Reload()
    assert [e.value for e in acc.Scalars("data/skipped_records")] == [2.0, 2.0]
    assert acc.Scalars("data/truncated_prompts")[-1].value == 1.0
    assert {"train/reward", "train/correction_success", "train/unscorable", "data/skipped"} <= set(
        cli.trainer.progress_bar_metrics
    )
