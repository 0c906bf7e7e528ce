"""Benchmarks by name: local JSONL files (the shared data folder), golds, uids, errors."""
import json
import sys
from pathlib import Path

import pytest

from ibpo_lit.data.benchmarks import BENCHMARKS, DATASETS_MISSING, load_benchmark
from ibpo_lit.data.records import BadRecordError
from ibpo_lit.rewards import math_scores

FILES = {
    "gsm8k": "gsm8k_test.jsonl",
    "gsm8k_train": "gsm8k_train.jsonl",
    "math500": "math500_test.jsonl",
    "aime25": "aime2025.jsonl",
    "hmmt25": "hmmt_feb2025.jsonl",
}


def _line(path: Path, line: int) -> dict:
    with path.open(encoding="utf-8") as f:
        for k, text in enumerate(f, start=1):
            if k == line:
                return json.loads(text)
    raise IndexError(line)


@pytest.mark.parametrize(
    "name, count", [("gsm8k", 1319), ("gsm8k_train", 7473), ("math500", 500), ("aime25", 30), ("hmmt25", 30)]
)
def test_counts(name, count, shared_data):
    records = load_benchmark(name, shared_data(FILES[name]))
    assert len(records) == count == BENCHMARKS[name].size
    assert len({r.uid for r in records}) == count  # uids are unique


def test_gsm8k_golds_and_uids(shared_data):
    path = shared_data(FILES["gsm8k"])
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
def test_plain_golds_and_uids(name, shared_data):
    path = shared_data(FILES[name])
    records = load_benchmark(name, path)
    id_key = BENCHMARKS[name].id_key
    for line in (1, 2, len(records)):
        raw = _line(path, line)
        assert records[line - 1].gold == str(raw["answer"]).strip()
        assert records[line - 1].uid == raw[id_key]


def test_known_golds(shared_data):
    aime = load_benchmark("aime25", shared_data(FILES["aime25"]))
    assert (aime[0].uid, aime[0].gold) == ("aime2025_I_1", "70")
    hmmt = load_benchmark("hmmt25", shared_data(FILES["hmmt25"]))
    assert (hmmt[-1].uid, hmmt[-1].gold) == ("hmmt_feb2025_30", "\\sqrt{\\frac{95}{24}}")
    math500 = load_benchmark("math500", shared_data(FILES["math500"]))
    assert math500[0].uid == "test/precalculus/807.json"
    assert math500[0].gold == "\\left( 3, \\frac{\\pi}{2} \\right)"


def test_golds_score_through_the_verifier(shared_data):
    aime = load_benchmark("aime25", shared_data(FILES["aime25"]))
    assert math_scores([f"#### {r.gold}" for r in aime], [r.gold for r in aime]) == [1.0] * 30
    hmmt = load_benchmark("hmmt25", shared_data(FILES["hmmt25"]))
    assert math_scores([f"\\boxed{{{r.gold}}}" for r in hmmt], [r.gold for r in hmmt]) == [1.0] * 30
    # and a wrong answer is wrong, not unscorable
    assert math_scores(["#### 71"], [aime[0].gold]) == [0.0]


def test_limit(shared_data):
    records = load_benchmark("aime25", shared_data(FILES["aime25"]), limit=3)
    assert [r.uid for r in records] == ["aime2025_I_1", "aime2025_I_2", "aime2025_I_3"]
    with pytest.raises(ValueError, match="limit"):
        load_benchmark("aime25", shared_data(FILES["aime25"]), limit=0)


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


# ------------------------------------------------------------------ code benchmarks
CODE_FILES = {"humaneval": "humaneval.jsonl", "mbpp": "mbpp_full.jsonl", "mbpp_sanitized": "mbpp_sanitized.jsonl"}


@pytest.mark.parametrize("name, count, first, last", [
    ("humaneval", 164, "HumanEval/0", "HumanEval/163"),
    ("mbpp", 500, "mbpp/11", "mbpp/510"),  # the test split by default
    ("mbpp_sanitized", 257, "mbpp_sanitized/11", "mbpp_sanitized/479"),  # sanitized dropped 480-510
])
def test_code_counts_and_uids(name, count, first, last, shared_data):
    from ibpo_lit.data.benchmarks import CODE_BENCHMARKS
    from ibpo_lit.rewards.code import CodeTests

    records = load_benchmark(name, shared_data(CODE_FILES[name]))
    assert len(records) == count == CODE_BENCHMARKS[name].size
    assert (records[0].uid, records[-1].uid) == (first, last)
    assert len({r.uid for r in records}) == count
    assert CodeTests.from_gold(records[0].gold).tests  # the gold is the sandbox's test spec


def test_mbpp_other_splits_from_the_shared_file(shared_data):
    path = shared_data(CODE_FILES["mbpp"])
    assert len(load_benchmark("mbpp", path, mbpp_split="all")) == 974
    assert len(load_benchmark("mbpp", path, mbpp_split="validation")) == 90
    assert [r.uid for r in load_benchmark("mbpp", path, mbpp_split="train", limit=2)] == ["mbpp/601", "mbpp/602"]


def _mbpp_line(task_id: int) -> dict:
    return {"task_id": task_id, "text": f"Task {task_id}.", "code": "def f(x):\r\n  return x",
            "test_list": ["assert f(1) == 1"], "test_setup_code": "", "challenge_test_list": []}


def test_mbpp_split_and_limit_on_a_small_file(tmp_path):
    f = tmp_path / "mbpp.jsonl"
    f.write_text("".join(json.dumps(_mbpp_line(t)) + "\n" for t in (3, 11, 12, 13, 600, 974)))
    assert [r.uid for r in load_benchmark("mbpp", f)] == ["mbpp/11", "mbpp/12", "mbpp/13"]
    assert [r.uid for r in load_benchmark("mbpp", f, limit=2)] == ["mbpp/11", "mbpp/12"]  # limit after the split
    assert [r.uid for r in load_benchmark("mbpp", f, mbpp_split="all")] == [
        "mbpp/3", "mbpp/11", "mbpp/12", "mbpp/13", "mbpp/600", "mbpp/974"]
    assert load_benchmark("mbpp", f)[0].problem.startswith("Task 11.\nYour code should pass these tests:")
    with pytest.raises(ValueError, match="mbpp_split must be one of"):
        load_benchmark("mbpp", f, mbpp_split="dev")
    with pytest.raises(ValueError, match="applies to mbpp and mbpp_sanitized only, not 'gsm8k'"):
        load_benchmark("gsm8k", f, mbpp_split="train")


def test_benchmark_task():
    from ibpo_lit.data.benchmarks import benchmark_task

    assert [benchmark_task(n) for n in ("gsm8k", "aime25", "humaneval", "mbpp", "mbpp_sanitized", "livecodebench")] == [
        "math", "math", "code", "code", "code", "code"]
    with pytest.raises(ValueError, match=r"unknown benchmark 'apps'.*'humaneval'.*'livecodebench'.*'mbpp'"):
        benchmark_task("apps")


def test_livecodebench_needs_a_file():
    with pytest.raises(ValueError, match="'livecodebench' has no hub path; pass --path"):
        load_benchmark("livecodebench")


class _FakeDatasets:
    """Stands in for the `datasets` library: ``load_dataset`` serves rows from a dict."""

    def __init__(self, rows):
        self.rows, self.calls = rows, []

    def load_dataset(self, hub_id, config, split):
        self.calls.append((hub_id, config, split))
        return list(self.rows[(hub_id, config, split)])


def test_code_hub_rows_go_through_the_file_loaders(monkeypatch):
    he_row = {"task_id": "HumanEval/0", "prompt": "def f(x):\n", "entry_point": "f",
              "canonical_solution": "    return x\n", "test": "def check(c):\n    assert c(1) == 1\n"}
    fake = _FakeDatasets({
        ("openai/openai_humaneval", None, "test"): [he_row],
        ("google-research-datasets/mbpp", "full", "test"): [_mbpp_line(11), _mbpp_line(12)],
        ("google-research-datasets/mbpp", "full", "prompt"): [_mbpp_line(2)],
        ("google-research-datasets/mbpp", "full", "validation"): [_mbpp_line(511)],
        ("google-research-datasets/mbpp", "full", "train"): [_mbpp_line(601)],
    })
    monkeypatch.setitem(sys.modules, "datasets", fake)
    assert [r.uid for r in load_benchmark("humaneval")] == ["HumanEval/0"]
    assert [r.uid for r in load_benchmark("mbpp", limit=1)] == ["mbpp/11"]
    assert fake.calls[-1] == ("google-research-datasets/mbpp", "full", "test")
    assert [r.uid for r in load_benchmark("mbpp", mbpp_split="all")] == [
        "mbpp/2", "mbpp/11", "mbpp/12", "mbpp/511", "mbpp/601"]
    file_record = load_benchmark("humaneval", _write(he_row))[0]
    assert load_benchmark("humaneval")[0] == file_record  # same problem text and gold as from a file


def _write(row) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "he.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


def test_math_hub_rows_parse_like_file_lines(monkeypatch):
    fake = _FakeDatasets({("MathArena/aime_2025", None, "train"): [
        {"problem": "1+1?", "answer": 2, "id": "aime2025_I_1"}, {"problem": "2+2?", "answer": "4"}]})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    records = load_benchmark("aime25")
    assert [(r.uid, r.gold) for r in records] == [("aime2025_I_1", "2"), ("MathArena/aime_2025/train:2", "4")]


def test_code_hub_without_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="pip install datasets, or pass --path"):
        load_benchmark("humaneval")
