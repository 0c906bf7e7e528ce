"""``evaluate --tools.*``: sampling with tool-integrated rollouts, scored and reported."""
import json

import pytest

from ibpo_lit.evaluation.runner import evaluate
from ibpo_lit.rollout.tools import ToolConfig


@pytest.mark.slow
def test_evaluate_samples_with_the_tool_and_reports_its_use(taught_tool_policy, tmp_path):
    problems = tmp_path / "sums.jsonl"
    problems.write_text("".join(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                                for a, b in [(1, 2), (3, 0), (2, 2)]))
    common = dict(model_name_or_path=str(taught_tool_policy), benchmark="sums", path=str(problems),
                  answer_format="plain", k=2, max_new_tokens=64, instruction="Give the final answer after ####.",
                  keep_completions=True)
    result = evaluate(**common, tools=ToolConfig(max_tool_calls=2, workers=2))
    assert result["tools"]["max_tool_calls"] == 2
    assert result["tool_calls"] > 0.5 and 0 <= result["tool_errors"] <= result["tool_calls"]
    texts = [t for p in result["problems"] for t in p["completions"]]
    assert any("```output\n" in t for t in texts)
    without = evaluate(**common)
    assert without["tools"] is None and "tool_calls" not in without
