"""Scoring stage without a model: hand-written programs through the sandbox, exact pass@k by hand."""
import pytest

from ibpo_lit.data.prompt import Prompt
from ibpo_lit.evaluation.runner import summarize
from ibpo_lit.evaluation.scoring import Verdicts, score_samples, status_counts
from ibpo_lit.rewards.code import CodeResult, CodeTests
from ibpo_lit.tasks import code_verdict

ADD_GOLD = CodeTests(tests=("assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"),
                     remote=("add",)).to_gold()
SQUARE_GOLD = CodeTests(tests=("assert square(2) == 4", "assert square(3) == 9"), remote=("square",),
                        timeout_s=2).to_gold()
# Problem "add": right, wrong on two of three tests, right inside prose.
ADD = ["```python\ndef add(a, b):\n    return a + b\n```",
       "def add(a, b):\n    return a + b if a > 0 else 1\n",
       "Here it is:\n```python\ndef add(a, b):\n    return b + a\n```\nDone."]
# Problem "square": passes one of two tests, does not parse, never returns.
SQUARE = ["def square(x):\n    return x * 2\n",
          "def square(x) return x\n",
          "def square(x):\n    while True:\n        pass\n"]


def test_code_verdict_and_status_counts():
    assert code_verdict(CodeResult(passed=3, total=3, status="pass")) == (1.0, 1.0, "pass")
    assert code_verdict(CodeResult(passed=2, total=3, status="fail")) == (0.0, 2 / 3, "fail")
    assert code_verdict(None) == (None, None, "unscorable")
    assert status_counts([["pass", "fail"], ["fail", "unscorable"]]) == {
        "pass": 1, "fail": 2, "timeout": 0, "memory": 0, "error": 0, "unscorable": 1}
    with pytest.raises(ValueError, match="unknown sandbox statuses"):
        status_counts([["passed"]])


def test_code_samples_score_in_the_sandbox_and_give_hand_computed_metrics():
    verdicts = score_samples("code", [ADD, SQUARE], [ADD_GOLD, SQUARE_GOLD], workers=2)
    assert verdicts.scores == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert verdicts.test_fracs == [[1.0, pytest.approx(1 / 3), 1.0], [0.5, 0.0, 0.0]]
    assert verdicts.statuses == [["pass", "fail", "pass"], ["fail", "error", "timeout"]]

    prompts = [Prompt([1], "p", ADD_GOLD, task="code", uid="add"), Prompt([1], "q", SQUARE_GOLD, task="code", uid="sq")]
    answers = [[None] * 3, [None] * 3]
    result = summarize(prompts, [ADD, SQUARE], verdicts, answers, [[5] * 3] * 2, [[True] * 3] * 2, k=3)
    assert result["avg@k"] == pytest.approx(2 / 6)
    assert result["pass@1"] == pytest.approx(2 / 6)  # (2/3 + 0) / 2
    assert result["pass@k"] == 0.5  # "add" has a correct sample, "square" none
    assert result["maj@k"] is None  # no majority vote over programs
    assert result["test_pass_frac"] == pytest.approx((1 + 1 / 3 + 1 + 1 / 2 + 0 + 0) / 6)  # 17/36
    assert result["sandbox_status"] == {"pass": 2, "fail": 2, "timeout": 1, "memory": 0, "error": 1, "unscorable": 0}
    assert result["unscorable_frac"] == 0.0
    assert result["problems"][1] == {"uid": "sq", "n_correct": 0, "n_unscorable": 0, "scores": [0.0, 0.0, 0.0],
                                     "test_fracs": [0.5, 0.0, 0.0], "statuses": ["fail", "error", "timeout"]}


def test_unscorable_code_gold_is_none_not_zero():
    verdicts = score_samples("code", [["def f(): pass"]], ['{"not": "a gold"}'])
    assert verdicts == Verdicts(scores=[[None]], test_fracs=[[None]], statuses=[["unscorable"]])


def test_math_samples_score_through_math_verify():
    verdicts = score_samples("math", [["#### 5", "#### 6"], ["\\boxed{\\frac{1}{2}}"]], ["5", "0.5"])
    assert verdicts == Verdicts(scores=[[1.0, 0.0], [1.0]])
    with pytest.raises(ValueError, match="unknown task"):
        score_samples("lean", [["x"]], ["y"])
