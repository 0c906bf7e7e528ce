"""Code task formats: HumanEval, MBPP full/sanitized (shared data folder), LiveCodeBench (fixture).

The canonical-solution check runs a sample here; the full sets (164 + 974 + 427 programs, all
passing) take about three minutes on two cores.
"""
import base64
import json
import pickle
import zlib
from pathlib import Path

import pytest

from ibpo_lit.data.code_tasks import (
    CODE_LOADERS,
    LCB_IMPORTS,
    CodeTask,
    decode_test_cases,
    extract_code,
    load_code_tasks,
    load_humaneval,
    load_livecodebench,
    load_mbpp,
    load_mbpp_sanitized,
    mbpp_split,
)
from ibpo_lit.data.records import BadRecordError, Record
from ibpo_lit.rewards import CodeTests, SandboxPool

LCB = Path(__file__).resolve().parents[1] / "fixtures" / "livecodebench_sample.jsonl"


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(num_workers=2) as p:
        yield p


# ------------------------------------------------------------------ extraction
@pytest.mark.parametrize(
    "text, code",
    [
        ("```python\na = 1\n```", "a = 1\n"),
        ("```py\nx\n```\nthen\n```python\nfinal = 2\n```\n```\nplain\n```", "final = 2\n"),  # last python block
        ("```\nplain = 1\n```\ntext\n```\nplain = 2\n```", "plain = 2\n"),  # no python tag: last plain
        ("```js\nlet a\n```\n```\nok = 1\n```", "ok = 1\n"),
        ("def f():\n    return 1\n", "def f():\n    return 1\n"),  # raw text
        ("Sure!\n```Python  \nz = 3\n```", "z = 3\n"),
        ("```python\ntruncated = 1\n", "truncated = 1\n"),  # unclosed final fence
        ("<think>```python\nwrong = 1\n```</think>\n```python\nright = 1\n```", "right = 1\n"),
    ],
)
def test_extract_code(text, code):
    assert extract_code(text) == code


# ------------------------------------------------------------------ HumanEval
def test_humaneval_tasks(shared_data):
    tasks = load_humaneval(shared_data("humaneval.jsonl"))
    assert len(tasks) == 164 and tasks[0].uid == "HumanEval/0" and tasks[-1].uid == "HumanEval/163"
    t = tasks[0]
    assert t.entry_point == "has_close_elements" and t.spec.remote == ("has_close_elements",)
    assert t.problem.startswith("Complete the following Python function:\n\n```python\nfrom typing import List")
    assert t.spec.prefix == t.spec.prelude and len(t.tests) == 1 and t.tests[0].endswith("check(has_close_elements)\n")
    assert CodeTests.from_gold(t.gold) == t.spec and json.loads(t.gold)["v"] == 3
    assert t.to_record() == Record(problem=t.problem, gold=t.gold, uid="HumanEval/0")


def _humaneval_row(test: str) -> dict:
    return {"task_id": "HumanEval/x", "prompt": "def f(x):\n", "entry_point": "f",
            "canonical_solution": "    return x\n", "test": test}


def test_humaneval_check_must_assert(tmp_path):
    path = tmp_path / "he.jsonl"
    ok = _humaneval_row("def check(candidate):\n    for x in (1, 2):\n        assert candidate(x) == x\n")
    no_assert = _humaneval_row("def check(candidate):\n    candidate(1)\n")  # passes whatever f returns
    path.write_text(json.dumps(ok) + "\n" + json.dumps(no_assert) + "\n")
    with pytest.raises(BadRecordError, match=r"he.jsonl:2: field 'test': `check` holds no assert"):
        load_humaneval(path)
    assert [t.spec.remote for t in load_humaneval(path, allow_non_assert=True)] == [("f",), ("f",)]
    assert len(load_code_tasks("humaneval", path, allow_non_assert=True)) == 2  # by name, through kwargs
    path.write_text(json.dumps(_humaneval_row("def test(candidate):\n    assert candidate(1) == 1\n")) + "\n")
    with pytest.raises(BadRecordError, match=r"he.jsonl:1: field 'test': defines no function `check`"):
        load_humaneval(path, allow_non_assert=True)  # nothing to call: never accepted


# ------------------------------------------------------------------ MBPP
def test_mbpp_full_tasks(shared_data):
    tasks = load_mbpp(shared_data("mbpp_full.jsonl"))
    assert len(tasks) == 974
    by_id = {t.uid: t for t in tasks}
    assert sum(t.split == "test" for t in tasks) == 500 and sum(t.split == "train" for t in tasks) == 374
    assert len(load_mbpp(shared_data("mbpp_full.jsonl"), split="validation")) == 90
    t = by_id["mbpp/11"]
    assert "\r" not in t.reference and t.entry_point == "remove_Occ" and len(t.tests) == 3
    assert t.problem.startswith("Write a python function to remove first and last occurrence")
    assert t.problem.endswith(t.tests[2]) and "Your code should pass these tests:" in t.problem
    assert "root = Node(1)" in by_id["mbpp/367"].setup and "\r" not in by_id["mbpp/927"].setup
    for uid, entry in (("mbpp/367", "is_tree_balanced"), ("mbpp/927", "max_height")):  # the setup's Node too
        assert by_id[uid].spec.remote == ("Node", entry) and by_id[uid].entry_point == entry
    assert by_id["mbpp/126"].spec.remote == ("sum",)  # the tested function shadows a builtin
    # The expected side's sys.getsizeof is the judge's (the reference's import), not the program's.
    assert by_id["mbpp/596"].spec.prelude == "import sys\n" and by_id["mbpp/596"].spec.remote == ("tuple_size",)
    assert [t.uid for t in tasks if t.spec.prelude] == ["mbpp/596"] and not any(t.spec.suffix for t in tasks)
    assert all(json.loads(t.gold)["v"] == 3 for t in tasks)
    one = load_mbpp(shared_data("mbpp_full.jsonl"), limit=1, shown_tests=1)[0]
    assert one.problem.count("assert ") == 1 and len(one.tests) == 3


def test_mbpp_sanitized_tasks(shared_data):
    tasks = load_mbpp_sanitized(shared_data("mbpp_sanitized.jsonl"))
    assert len(tasks) == 427
    counts = {s: sum(t.split == s for t in tasks) for s in ("prompt", "test", "validation", "train")}
    assert counts == {"prompt": 7, "test": 257, "validation": 43, "train": 120}
    with_imports = [t for t in tasks if t.spec.suffix]  # test_imports: after the solution, and in the judge
    assert len(with_imports) == 13 and all(t.spec.suffix == t.spec.prelude == "import math\n" for t in with_imports)
    assert not any(t.setup for t in tasks)
    by_id = {t.uid: t for t in tasks}
    assert by_id["mbpp_sanitized/596"].spec.prelude == "import sys\n" and not by_id["mbpp_sanitized/596"].spec.suffix
    assert by_id["mbpp_sanitized/82"].spec.prelude == "import math\n"  # the reference's import too: not twice
    assert tasks[0].uid == "mbpp_sanitized/2"
    assert tasks[0].problem.startswith("Write a function to find the shared elements from the given two lists.")


@pytest.mark.parametrize("task_id, split", [(1, "prompt"), (10, "prompt"), (11, "test"), (510, "test"),
                                            (511, "validation"), (600, "validation"), (601, "train"), (974, "train")])
def test_mbpp_split(task_id, split):
    assert mbpp_split(task_id) == split


def test_mbpp_bad_arguments(shared_data):
    with pytest.raises(ValueError, match="split must be one of"):
        load_mbpp(shared_data("mbpp_full.jsonl"), split="dev")
    with pytest.raises(ValueError, match="outside 1..974"):
        mbpp_split(975)


def _mbpp_row(code: str, tests: list[str], task_id: int = 601) -> dict:
    return {"task_id": task_id, "text": "Halve a number.", "code": code, "test_list": tests,
            "test_setup_code": "", "challenge_test_list": []}


HALF = "import re\nfrom fractions import Fraction as F\ndef half(x):\n    return float(F(x, 2))\n"


def test_mbpp_non_assert_tests_are_rejected(tmp_path):
    path = tmp_path / "mbpp.jsonl"
    good = _mbpp_row(HALF, ["assert half(1) == 0.5"])
    bare = _mbpp_row(HALF, ["assert half(2) == 1.0", "half(1)"], task_id=602)  # passes whatever half returns
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bare) + "\n")
    sanitized = tmp_path / "san.jsonl"
    sanitized.write_text(path.read_text().replace('"text"', '"prompt"'))
    for loader, file in ((load_mbpp, path), (load_mbpp_sanitized, sanitized)):
        with pytest.raises(BadRecordError, match=rf"{file.name}:3: field 'test_list': test 1 is not an assert "
                                                 r"statement: 'half\(1\)'") as e:
            loader(file)
        assert (e.value.path, e.value.line, e.value.field) == (str(file), 3, "test_list")
    assert [t.uid for t in load_mbpp(path, allow_non_assert=True)] == ["mbpp/601", "mbpp/602"]
    assert len(load_code_tasks("mbpp_sanitized", sanitized, allow_non_assert=True)) == 2  # by name, through kwargs
    for test in ("assert half(1) == 0.5; x = 1", "", "x = half(1)\nassert x == 0.5"):  # not only asserts
        path.write_text(json.dumps(_mbpp_row(HALF, [test])) + "\n")
        with pytest.raises(BadRecordError, match="test 0 is not an assert statement"):
            load_mbpp(path)
    path.write_text(json.dumps(_mbpp_row(HALF, ["assert half(1) == 0.5", "assert half("])) + "\n")
    with pytest.raises(BadRecordError, match=r"mbpp.jsonl:1: field 'test_list': does not parse"):
        load_mbpp(path, allow_non_assert=True)
    path.write_text(json.dumps(_mbpp_row("half = lambda x: x / 2\n", ["assert half(1) == 0.5"])) + "\n")
    with pytest.raises(BadRecordError, match=r"field 'code': defines no function or class the tests name"):
        load_mbpp(path)


def test_mbpp_reference_imports_the_tests_use_are_the_judges(tmp_path, pool):
    path = tmp_path / "mbpp.jsonl"
    path.write_text(json.dumps(_mbpp_row(HALF, ["assert half(1) == float(F(1, 2))", "assert half(4) == 2"])) + "\n")
    t = load_mbpp(path)[0]
    # F (aliased) is read by a test: its import is the judge's; re is not read: left out.
    assert t.spec.prelude == "from fractions import Fraction as F\n" and t.spec.remote == ("half",)
    assert not t.spec.suffix and not t.setup
    # Without the prelude import F would be unresolvable (unscorable); with it the reference passes.
    assert pool.score([(t.reference, t.gold), ("def half(x):\n    return 0.0\n", t.gold)]) == [1.0, 0.0]


# ------------------------------------------------------------------ canonical solutions (a sample)
def _canonical(task: CodeTask) -> str:
    # HumanEval's reference is prompt + body; the program adds the prompt itself, so send the body.
    return task.reference[len(task.spec.prefix):] if task.spec.prefix else task.reference


def test_canonical_solutions_pass_on_a_sample(pool, shared_data):
    he = load_humaneval(shared_data("humaneval.jsonl"))
    mbpp = {t.uid: t for t in load_mbpp(shared_data("mbpp_full.jsonl"))}
    san = load_mbpp_sanitized(shared_data("mbpp_sanitized.jsonl"))
    sample = (
        [he[i] for i in (0, 10, 32, 38, 50, 53, 100, 162)]  # 32, 38, 50 call prompt helpers from check
        + [mbpp[f"mbpp/{i}"] for i in (11, 126, 341, 367, 596, 642, 927, 974)]  # 367/927: setup; 126: sum
        + [t for t in san if t.spec.prelude][:3] + san[-3:]
    )
    results = pool.run([(_canonical(t), t.gold) for t in sample])
    failed = [(t.uid, r.status if r else None, r.detail if r else None) for t, r in zip(sample, results)
              if r is None or r.status != "pass"]
    assert not failed


def test_wrong_solutions_fail(pool, shared_data):
    he = load_humaneval(shared_data("humaneval.jsonl"), limit=3)
    mbpp = load_mbpp(shared_data("mbpp_full.jsonl"), limit=3)
    pairs = [(_canonical(he[1]), he[0].gold), (_canonical(he[0]), he[2].gold),  # another task's solution
             (mbpp[1].reference, mbpp[0].gold), ("", mbpp[2].gold)]
    assert pool.score(pairs) == [0.0, 0.0, 0.0, 0.0]


# ------------------------------------------------------------------ LiveCodeBench
LCB_SOLUTIONS = {
    "abc390_a": "```python\nn = int(input())\nprint(sum(map(int, input().split())))\n```",
    "2235": "```python\nclass Solution:\n    def sum(self, num1: int, num2: int) -> int:\n        return num1 + num2\n```",
    "977": "```python\nclass Solution:\n    def sortedSquares(self, nums: List[int]) -> List[int]:\n"
           "        return tuple(sorted(x * x for x in nums))\n```",  # a tuple is compared as a list
    "2070A": "```python\nimport sys\nd = list(map(int, sys.stdin.read().split()))\n"
             "s, n = sum(d[1:]), d[0]\nprint(s // n if s % n == 0 else s / n)\n```",
    "abc380_a": "```python\ns = open(0).read().split('\\n')[0]\nprint(s)\nprint(s)\n```",
}
LCB_WRONG = {
    "abc390_a": "n = int(input())\nprint(n)\n",
    "2235": "class Solution:\n    def sum(self, num1, num2):\n        return num1 - num2\n",
    "977": "class Solution:\n    def sortedSquares(self, nums):\n        return [x * x for x in nums]\n",
    "2070A": "input()\nprint(1.5)\n",
    "abc380_a": "print(input())\n",
}


def test_livecodebench_fixture_tasks():
    tasks = {t.uid: t for t in load_livecodebench(LCB)}
    assert list(tasks) == ["abc390_a", "2235", "977", "2070A", "abc380_a"]
    stdin, func = tasks["abc390_a"], tasks["977"]
    assert stdin.spec.kind == "stdin" and len(stdin.tests) == 4  # 2 public + 2 private (base64/zlib/pickle)
    assert stdin.tests[2] == {"input": "5\n10 20 30 40 50\n", "output": "150\n"}
    assert stdin.problem.endswith("```python\n# YOUR CODE HERE\n```") and stdin.entry_point is None
    assert func.spec.kind == "assert" and func.entry_point == "sortedSquares" and func.spec.remote == ("Solution",)
    assert func.tests[0] == "assert _as_lcb(Solution().sortedSquares(*[[-4, -1, 0, 3, 10]])) == [0, 1, 9, 16, 100]"
    assert "class Solution:\n    def sortedSquares" in func.problem
    assert all(t.spec.prefix == LCB_IMPORTS and t.spec.stop_at_first_failure for t in tasks.values())
    assert func.meta["platform"] == "leetcode" and func.meta["difficulty"] == "easy"
    v6 = load_livecodebench(LCB, start_date="2025-02-01", end_date="2025-05-31")
    assert [t.uid for t in v6] == ["abc390_a", "2235", "977", "2070A"]


def test_livecodebench_solutions_pass_and_wrong_ones_fail(pool):
    tasks = load_livecodebench(LCB)
    good = pool.run([(LCB_SOLUTIONS[t.uid], t.gold) for t in tasks])
    assert [(r.status, r.passed, r.total) for r in good] == [("pass", len(t.tests), len(t.tests)) for t in tasks]
    bad = pool.run([(LCB_WRONG[t.uid], t.gold) for t in tasks])
    assert [r.passed < r.total for r in bad] == [True] * len(tasks)
    assert bad[0].tests[-1] == "not_run"  # stops at the first failure


def test_livecodebench_private_tests_never_unpickle_objects(tmp_path):
    cases = [{"input": "1\n", "output": "1\n", "testtype": "stdin"}]
    encoded = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()
    assert decode_test_cases(encoded) == cases
    evil = base64.b64encode(zlib.compress(pickle.dumps(Path("/etc")))).decode()
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        decode_test_cases(evil)
    row = json.loads(LCB.read_text().splitlines()[0])
    row["private_test_cases"] = evil
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(BadRecordError, match="bad.jsonl:1: field 'test cases'"):
        load_livecodebench(bad)


def test_livecodebench_bad_rows(tmp_path):
    row = json.loads(LCB.read_text().splitlines()[1])
    row["metadata"] = "{}"
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(BadRecordError, match="functional problem without func_name"):
        load_livecodebench(path)
    del row["question_content"]
    path.write_text("\n" + json.dumps(row) + "\n")
    with pytest.raises(BadRecordError, match="x.jsonl:2: field 'question_content': missing"):
        load_livecodebench(path)
    path.write_text("{not json\n")
    with pytest.raises(BadRecordError, match="malformed JSON"):
        load_livecodebench(path)


# ------------------------------------------------------------------ by name
def test_load_code_tasks_by_name():
    assert set(CODE_LOADERS) == {"humaneval", "mbpp", "mbpp_sanitized", "livecodebench"}
    assert [t.uid for t in load_code_tasks("livecodebench", LCB, limit=2)] == ["abc390_a", "2235"]
    with pytest.raises(ValueError, match="valid names"):
        load_code_tasks("apps", LCB)
    with pytest.raises(ValueError, match="limit must be"):
        load_code_tasks("livecodebench", LCB, limit=0)
    with pytest.raises(FileNotFoundError):
        load_code_tasks("humaneval", "/nonexistent.jsonl")
