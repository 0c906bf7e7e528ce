"""evaluate() on code benchmarks: prompts, sandbox scores, pass@k by hand, errors."""
import pytest

from ibpo_lit.tasks import CODE_INSTRUCTION
from ibpo_lit.evaluation import runner
from ibpo_lit.evaluation.runner import evaluate

FAST = dict(k=2, max_new_tokens=8, batch_size=2)


def _canned(completions_by_uid, seen):
    """A stand-in for ``runner.sample`` that returns fixed completions and records the prompts."""
    def fake_sample(engine, tokenizer, prompts, k, seed, batch_size):
        seen.extend(prompts)
        texts = [completions_by_uid[p.uid] for p in prompts]
        return texts, [[10] * k for _ in prompts], [[True] * k for _ in prompts]
    return fake_sample


def test_mbpp_test_split_scored_in_the_sandbox(mbpp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "sample", _canned({
        # add: right; wrong on add(1, 2) and add(-1, 1), right on add(0, 0) -> 1/3 of the tests
        "mbpp/11": ["```python\ndef add(a, b):\n    return a + b\n```", "def add(a, b):\n    return a - b\n"],
        "mbpp/12": ["def square(x):\n    return x ** 2\n", "Sure.\n```python\ndef square(x):\n    return x * x\n```"],
    }, seen))
    result = evaluate("tiny-llama", "mbpp", mbpp_path, k=2)
    # the default split is MBPP's test split: tasks 2 (prompt) and 601 (train) are left out
    assert [p.uid for p in seen] == ["mbpp/11", "mbpp/12"] and result["n_problems"] == 2
    assert result["task"] == "code" and result["mbpp_split"] == "test"
    assert result["instruction"] == CODE_INSTRUCTION
    assert all(p.task == "code" and p.meta["instruction"] == CODE_INSTRUCTION for p in seen)
    from ibpo_lit.models.loading import load_tokenizer

    text = load_tokenizer("tiny-llama").decode(seen[0].prompt_ids)
    assert "Write a function to add two numbers." in text and text.rstrip().endswith("assistant")
    assert "Your code should pass these tests:" in text and CODE_INSTRUCTION in text
    # by hand: correct = [[1, 0], [1, 1]]
    assert result["avg@k"] == 0.75 and result["pass@1"] == 0.75
    assert result["pass@k"] == 1.0  # each problem has a correct sample
    assert result["maj@k"] is None
    assert result["test_pass_frac"] == pytest.approx((1 + 1 / 3 + 1 + 1) / 4)  # 5/6
    assert result["sandbox_status"] == {"pass": 3, "fail": 1, "timeout": 0, "memory": 0, "error": 0, "unscorable": 0}
    add = result["problems"][0]
    assert add["scores"] == [1.0, 0.0] and add["statuses"] == ["pass", "fail"] and add["n_correct"] == 1
    assert add["test_fracs"] == [1.0, pytest.approx(1 / 3)]
    assert "gold" not in add and "answers" not in add  # the gold is the test suite: not copied out


def test_humaneval_body_or_whole_function(humaneval_path, monkeypatch):
    monkeypatch.setattr(runner, "sample", _canned({
        "Toy/0": ["    return a + b\n", "```python\ndef add(a, b):\n    return a * b\n```"],  # body; wrong function
        "Toy/1": ["    return x * x\n", "```python\ndef square(x):\n    return x * x\n```"],
    }, []))
    result = evaluate("tiny-llama", "humaneval", humaneval_path, k=2)
    assert [p["scores"] for p in result["problems"]] == [[1.0, 0.0], [1.0, 1.0]]
    assert result["pass@1"] == 0.75 and result["pass@k"] == 1.0
    assert result["test_pass_frac"] == 0.75  # one check() per problem: fractions are 0 or 1


def test_tiny_model_end_to_end_on_code(humaneval_path):
    result = evaluate("tiny-llama", "humaneval", humaneval_path, keep_completions=True, **FAST)
    assert result["n_problems"] == 2 and result["k"] == 2
    assert [p["uid"] for p in result["problems"]] == ["Toy/0", "Toy/1"]
    assert sum(result["sandbox_status"].values()) == 4
    # a random model cannot write "return a + b" in 8 characters
    assert result["pass@k"] == 0.0 and result["test_pass_frac"] == 0.0 and result["maj@k"] is None
    for p in result["problems"]:
        assert len(p["completions"]) == len(p["statuses"]) == len(p["test_fracs"]) == 2


def test_code_settings_fail_before_loading(monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("loaded a model despite a bad setting")

    monkeypatch.setattr(runner, "load_model", no_load)
    with pytest.raises(ValueError, match=r"unknown benchmark 'mbpp_plus'; valid names: .*'humaneval'.*'livecodebench'"):
        evaluate("tiny-llama", "mbpp_plus", None)
    with pytest.raises(FileNotFoundError, match="--path: no such file: x.jsonl"):  # a name of your own data
        evaluate("tiny-llama", "mbpp_plus", "x.jsonl")
    with pytest.raises(ValueError, match="mbpp_split must be one of"):
        evaluate("tiny-llama", "mbpp", "x.jsonl", mbpp_split="dev")
    with pytest.raises(ValueError, match="applies to mbpp and mbpp_sanitized only, not 'humaneval'"):
        evaluate("tiny-llama", "humaneval", "x.jsonl", mbpp_split="train")
    with pytest.raises(ValueError, match="livecodebench.*no hub path; pass --path"):
        evaluate("tiny-llama", "livecodebench", None)
    with pytest.raises(ValueError, match="sandbox_workers must be >= 1"):
        evaluate("tiny-llama", "mbpp", "x.jsonl", sandbox_workers=0)
