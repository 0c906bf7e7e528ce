"""Reading problem/gold records from JSONL: formats, every error, the skip policy."""
import json
from pathlib import Path

import pytest

from ibpo_lit.data.records import BadRecordError, RecordFormat, read_records


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    with path.open("wb") as f:
        for line in lines:
            f.write((line if isinstance(line, bytes) else line.encode("utf-8")) + b"\n")
    return path


def rec(question="What is 2 + 2?", answer="2 + 2 = 4\n#### 4", **extra) -> str:
    return json.dumps({"question": question, "answer": answer, **extra})


def test_gsm8k_records(tmp_path):
    path = write_lines(tmp_path / "g.jsonl", [
        rec(),
        rec("Big?", "1,000 + 80 = <<1000+80=1080>>1,080\n#### 1,080"),
        "",  # blank lines are ignored
        rec("Neg?", "#### -3"),
    ])
    records = list(read_records(path))
    assert [(r.problem, r.gold, r.uid) for r in records] == [
        ("What is 2 + 2?", "4", "g.jsonl:1"),
        ("Big?", "1080", "g.jsonl:2"),
        ("Neg?", "-3", "g.jsonl:4"),
    ]


def test_plain_answers_with_other_keys(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [
        json.dumps({"problem": "Half?", "answer": "\\frac{1}{2}", "level": 2}),
        json.dumps({"problem": "AIME?", "answer": 204}),  # AIME stores ints
    ])
    fmt = RecordFormat(question_key="problem", answer_format="plain")
    assert [(r.problem, r.gold) for r in read_records(path, fmt)] == [("Half?", "\\frac{1}{2}"), ("AIME?", "204")]


@pytest.mark.parametrize(
    "line, field, reason",
    [
        ('{"question": "x", "answer": "#### 1"', None, "malformed JSON"),
        ('["question", "answer"]', None, "expected a JSON object"),
        (json.dumps({"answer": "#### 1"}), "question", "missing"),
        (json.dumps({"question": "x"}), "answer", "missing"),
        (json.dumps({"question": 3, "answer": "#### 1"}), "question",
         "expected a string or a list of messages, got int"),
        (json.dumps({"question": "x", "answer": 1}), "answer", "expected a string, got int"),
        (json.dumps({"question": "  ", "answer": "#### 1"}), "question", "empty question"),
        (json.dumps({"question": "x", "answer": "it is 1"}), "answer", "no '####'"),
        (json.dumps({"question": "x", "answer": "#### "}), "answer", "empty final answer"),
        (b'{"question": "caf\xe9", "answer": "#### 1"}', None, "invalid UTF-8"),
    ],
)
def test_bad_record_errors_name_file_line_field(tmp_path, line, field, reason):
    path = write_lines(tmp_path / "bad.jsonl", [rec(), rec(), line, rec()])
    with pytest.raises(BadRecordError) as info:
        list(read_records(path))
    err = info.value
    assert (err.line, err.field) == (3, field)
    message = str(err)
    assert message.startswith(f"{path}:3")
    assert reason in message
    if field:
        assert repr(field) in message


def test_skip_policy_counts_and_keeps_going(tmp_path):
    path = write_lines(tmp_path / "mixed.jsonl", [
        rec("a"), "{not json", rec("b"), json.dumps({"question": "c"}), rec("d", "no marker"), rec("e"),
    ])
    skipped = []
    records = list(read_records(path, on_bad_record="skip", skipped=skipped))
    assert [r.problem for r in records] == ["a", "b", "e"]
    assert [(e.line, e.field) for e in skipped] == [(2, None), (4, "answer"), (5, "answer")]


def test_empty_file(tmp_path):
    path = write_lines(tmp_path / "empty.jsonl", [])
    with pytest.raises(BadRecordError, match=f"no records in {path}$"):
        list(read_records(path))


def test_all_records_skipped_is_an_error(tmp_path):
    path = write_lines(tmp_path / "allbad.jsonl", ["{", "["])
    with pytest.raises(BadRecordError, match=r"no records in .*allbad.jsonl \(2 bad records skipped\)"):
        list(read_records(path, on_bad_record="skip"))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        list(read_records(tmp_path / "nope.jsonl"))


def test_bad_options():
    with pytest.raises(ValueError, match="answer_format"):
        RecordFormat(answer_format="latex")
    with pytest.raises(ValueError, match="on_bad_record"):
        list(read_records("x.jsonl", on_bad_record="ignore"))


def test_real_gsm8k_file(shared_data):
    gsm8k_test = shared_data("gsm8k_test.jsonl")
    records = []
    for r in read_records(gsm8k_test):
        records.append(r)
        if len(records) == 50:
            break
    with gsm8k_test.open(encoding="utf-8") as f:
        raw = [json.loads(next(f)) for _ in range(5)]
    for r, obj in zip(records, raw):
        assert r.problem == obj["question"].strip()
        assert r.gold == obj["answer"].split("####")[-1].strip().replace(",", "")
        assert r.gold.lstrip("-").isdigit()
    assert records[0].gold == "18"  # Janet's ducks
