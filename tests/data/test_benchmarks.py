"""Benchmarks by name: local JSONL files (the shared data folder), golds, uids, errors."""
import json
import sys
from pathlib import Path

import pytest

from ibpo_lit.data.benchmarks import BENCHMARKS, DATASETS_MISSING, load_benchmark
from ibpo_lit.data.records import BadRecordError
from ibpo_lit.rewards import math_scores

DATA = Path("/work/shared/data")
FILES = {
    "gsm8k": "gsm8k_test.jsonl",
    "gsm8k_train": "gsm8k_train.jsonl",
    "math500": "math500_test.jsonl",
    "aime25": "aime2025.jsonl",
    "hmmt25": "hmmt_feb2025.jsonl",
}


def _path(name: str) -> Path:
    path = DATA / FILES[name]
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return path


def _line(path: Path, line: int) -> dict:
    with path.open(encoding="utf-8") as f:
        for k, text in enumerate(f, start=1):
            if k == line:
                return json.loads(text)
    raise IndexError(line)


@pytest.mark.parametrize(
    "name, count", [("gsm8k", 1319), ("gsm8k_train", 7473), ("math500", 500), ("aime25", 30), ("hmmt25", 30)]
)
def test_counts(name, count):
    records = load_benchmark(name, _path(name))
    assert len(records) == count == BENCHMARKS[name].size
    assert len({r.uid for r in records}) == count  # uids are unique


def test_gsm8k_golds_and_uids():
    path = _path("gsm8k")
    records = load_benchmark("gsm8k", path)
    for line in (1, 1319):
        raw = _line(path, line)
        assert records[line - 1].gold == raw["answer"].rsplit("####", 1)[1].replace(",", "").strip()
        assert records[line - 1].problem == raw["question"].strip()
        assert records[line - 1].uid == f"gsm8k_test.jsonl:{line}"
    assert records[0].gold == "18"  # Janet's ducks
    finals = [json.loads(text)["answer"].rsplit("####", 1)[1] for text in path.open(encoding="utf-8")]
    with_commas = [r for r, final in zip(records, finals) if "," in final]
    assert len(with_commas) == 14  # "#### 1,080" style (SOURCES.md)
    assert all(r.gold == final.replace(",", "").strip() for r, final in zip(records, finals))


@pytest.mark.parametrize("name", ["math500", "aime25", "hmmt25"])
def test_plain_golds_and_uids(name):
    path = _path(name)
    records = load_benchmark(name, path)
    id_key = BENCHMARKS[name].id_key
    for line in (1, 2, len(records)):
        raw = _line(path, line)
        assert records[line - 1].gold == str(raw["answer"]).strip()
        assert records[line - 1].uid == raw[id_key]


def test_known_golds():
    aime = load_benchmark("aime25", _path("aime25"))
    assert (aime[0].uid, aime[0].gold) == ("aime2025_I_1", "70")
    hmmt = load_benchmark("hmmt25", _path("hmmt25"))
    assert (hmmt[-1].uid, hmmt[-1].gold) == ("hmmt_feb2025_30", "\\sqrt{\\frac{95}{24}}")
    math500 = load_benchmark("math500", _path("math500"))
    assert math500[0].uid == "test/precalculus/807.json"
    assert math500[0].gold == "\\left( 3, \\frac{\\pi}{2} \\right)"


def test_golds_score_through_the_verifier():
    aime = load_benchmark("aime25", _path("aime25"))
    assert math_scores([f"#### {r.gold}" for r in aime], [r.gold for r in aime]) == [1.0] * 30
    hmmt = load_benchmark("hmmt25", _path("hmmt25"))
    assert math_scores([f"\\boxed{{{r.gold}}}" for r in hmmt], [r.gold for r in hmmt]) == [1.0] * 30
    # and a wrong answer is wrong, not unscorable
    assert math_scores(["#### 71"], [aime[0].gold]) == [0.0]


def test_limit():
    records = load_benchmark("aime25", _path("aime25"), limit=3)
    assert [r.uid for r in records] == ["aime2025_I_1", "aime2025_I_2", "aime2025_I_3"]
    with pytest.raises(ValueError, match="limit"):
        load_benchmark("aime25", _path("aime25"), limit=0)


def test_local_file_without_ids_and_bad_records(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"problem": "1+1?", "answer": 2}\n\n{"problem": "2+2?", "answer": "4", "id": "x"}\n')
    records = load_benchmark("aime25", f)
    assert [(r.uid, r.gold) for r in records] == [("mine.jsonl:1", "2"), ("x", "4")]
    f.write_text('{"problem": "1+1?"}\n')
    with pytest.raises(BadRecordError, match=r"mine.jsonl:1: field 'answer': missing"):
        load_benchmark("hmmt25", f)
    with pytest.raises(FileNotFoundError):
        load_benchmark("gsm8k", tmp_path / "absent.jsonl")


def test_unknown_name():
    with pytest.raises(ValueError, match=r"unknown benchmark 'aime24'.*'aime25'.*'gsm8k'.*'hmmt25'.*'math500'"):
        load_benchmark("aime24", "whatever.jsonl")


def test_hub_without_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ImportError) as info:
        load_benchmark("gsm8k")
    assert str(info.value) == DATASETS_MISSING == "pip install datasets, or pass --path to a local JSONL file"


def test_product_does_not_reference_the_shared_folder():
    import ibpo_lit.data.benchmarks as b

    assert "/work/shared" not in Path(b.__file__).read_text()
