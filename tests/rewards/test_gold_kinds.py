"""Issue 43, item 5: gold data of the wrong kind. A tool call's ``run`` spec parsed as a code test
and scored any program that exits cleanly as a pass, through the code reward and the sandbox pool.

Each reward now refuses a gold of a kind it is not for with `GoldKindError`, naming the kind and
the reward; the training data's golds are checked when read. The forged pass is shown with the
check switched off (``check_kind`` patched out of ``ibpo_lit.rewards.code``): the same gold then
scores a program that only prints as 1.0.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

import ibpo_lit.data.datamodule as datamodule
import ibpo_lit.rewards.code as code
from ibpo_lit.data.datamodule import PromptDataModule
from ibpo_lit.models import build_tiny_tokenizer
from ibpo_lit.rewards import CodeTests, RewardPool, SandboxPool, code_reward, math_score_inprocess
from ibpo_lit.rewards.builtin import check_gold
from ibpo_lit.rewards.gold_kinds import GoldKindError, gold_kind
from ibpo_lit.rewards.sandbox.isolation import SandboxUnavailable
from ibpo_lit.tasks import get_task, scoring_pool

# What a tool call's spec looks like as a gold: to_gold refuses to write one, so it is made by hand
# (a data file, a program of someone's own), as an attacker of the data would.
RUN_GOLD = json.dumps({"v": 3, **dataclasses.asdict(CodeTests(kind="run", timeout_s=5.0))})
TEST_GOLD = CodeTests(tests=("assert f() == 3",), remote=("f",)).to_gold()
PRINTS = "print('all tests passed')\n"  # solves nothing, exits cleanly


@pytest.fixture(scope="module")
def sandbox():
    try:
        return code.detect_isolation()
    except SandboxUnavailable as e:
        pytest.skip(f"the code sandbox cannot run here: {e}")


def _check_off(monkeypatch):
    monkeypatch.setattr(code, "check_kind", lambda *args, **kwargs: None)


# ------------------------------------------------------------------ what a gold is
def test_gold_kinds_are_read_from_the_spec():
    assert gold_kind(RUN_GOLD) == "run" and gold_kind(TEST_GOLD) == "assert"
    stdin = CodeTests(kind="stdin", tests=({"input": "1", "output": "1"},)).to_gold()
    assert gold_kind(stdin) == "stdin"
    for answer in ("72", "\\frac{1}{2}", "{1, 2}", " {x} ", "[1]", "not a gold", ""):
        assert gold_kind(answer) == "answer", answer


def test_a_run_spec_is_never_written_as_a_gold():
    with pytest.raises(GoldKindError, match="'run' .* is not a gold"):
        CodeTests(kind="run").to_gold()


# ------------------------------------------------------------------ the code reward
def test_with_the_check_off_a_run_gold_passes_any_program_that_exits(sandbox, monkeypatch):
    _check_off(monkeypatch)
    assert code_reward(PRINTS, RUN_GOLD) == 1.0
    with SandboxPool(num_workers=1) as pool:
        assert pool.score([(PRINTS, RUN_GOLD)]) == [1.0]


def test_the_code_reward_refuses_a_run_gold():
    with pytest.raises(GoldKindError) as refused:
        code_reward(PRINTS, RUN_GOLD)
    message = str(refused.value)
    assert "'code' reward" in message and "of kind 'run'" in message and "'assert' or 'stdin'" in message
    with pytest.raises(GoldKindError, match="of kind 'run'"):
        CodeTests.from_gold(RUN_GOLD)


def test_the_sandbox_pool_refuses_a_run_gold_and_scores_the_rest(sandbox):
    with SandboxPool(num_workers=2) as pool:
        with pytest.raises(GoldKindError, match="'code' reward .* of kind 'run'"):
            pool.score([("def f():\n    return 3\n", TEST_GOLD), (PRINTS, RUN_GOLD)])
        assert (pool.stats["pass"], pool.stats["unscorable"]) == (1, 0)  # the run gold is neither
        assert pool.score([("def f():\n    return 3\n", TEST_GOLD)]) == [1.0]  # the pool still works


def test_the_code_tasks_pool_refuses_a_run_gold():
    task = get_task("code")
    with scoring_pool("code", num_workers=1) as pool:
        with pytest.raises(GoldKindError, match="of kind 'run'"):
            task.judge(pool, [(PRINTS, RUN_GOLD)])
        with pytest.raises(GoldKindError, match="of kind 'run'"):
            pool.score([(PRINTS, RUN_GOLD)])


def test_a_string_that_is_no_spec_stays_unscorable_for_the_code_reward():
    # The code reward cannot tell an answer from a corrupted spec: unscorable, as before.
    assert code_reward(PRINTS, "72") is None


# ------------------------------------------------------------------ the math reward
def test_the_math_reward_refuses_a_sandbox_spec():
    for gold, kind in ((TEST_GOLD, "assert"), (RUN_GOLD, "run")):
        with pytest.raises(GoldKindError, match=f"'math' reward .* of kind '{kind}'"):
            math_score_inprocess("#### 3", gold)
    assert math_score_inprocess("#### 3", "3") == 1.0


def test_the_math_pool_refuses_before_it_scores_anything():
    with RewardPool("math", num_workers=1, timeout_s=10.0) as pool:
        with pytest.raises(GoldKindError, match="of kind 'assert'.*code reward"):
            pool.score([("#### 3", "3"), ("#### 3", TEST_GOLD)])
        assert pool.stats == {"ok": 0, "timeout": 0, "error": 0, "none": 0}
        assert pool.score([("#### 3", "3")]) == [1.0]


def test_check_gold_passes_what_declares_no_kinds():
    check_gold("my_rewards:length", RUN_GOLD)  # an import path takes any gold
    check_gold(None, RUN_GOLD)  # a task with no verifier of its own
    check_gold("code", None)  # a record without a gold
    with pytest.raises(GoldKindError, match="^data.jsonl:4: the 'code' reward"):
        check_gold("code", "72", where="data.jsonl:4")  # the data check is strict: no spec is no test


# ------------------------------------------------------------------ the data
def _data(tmp_path, golds, name="train.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"question": f"Problem {i}", "answer": g}) + "\n" for i, g in enumerate(golds)))
    return str(path)


def _module(**kwargs):
    dm = PromptDataModule(answer_format="plain", max_prompt_tokens=4096, **kwargs)
    dm.tokenizer_obj = build_tiny_tokenizer()
    return dm


def test_training_data_with_a_run_gold_is_refused_when_read(tmp_path):
    train = _data(tmp_path, [TEST_GOLD, RUN_GOLD])
    with pytest.raises(GoldKindError, match=r"^train.jsonl:2: the 'code' reward .* of kind 'run'"):
        _module(train_path=train, task="code").setup("fit")


def test_with_the_data_check_off_the_run_gold_reaches_the_trainer(tmp_path, monkeypatch):
    monkeypatch.setattr(datamodule, "check_gold", lambda *args, **kwargs: None)
    dm = _module(train_path=_data(tmp_path, [RUN_GOLD]), task="code", prompts_per_step=1)
    dm.setup("fit")
    assert next(iter(dm.train_dataloader()))[0].gold == RUN_GOLD


def test_validation_data_and_math_data_are_checked_too(tmp_path):
    dm = _module(train_path=_data(tmp_path, [TEST_GOLD]), val_path=_data(tmp_path, [RUN_GOLD], "val.jsonl"),
                 task="code")
    dm.setup("fit")
    with pytest.raises(GoldKindError, match="^val.jsonl:1: .* of kind 'run'"):
        dm.val_prompts()
    with pytest.raises(GoldKindError, match="^train.jsonl:1: the 'math' reward .* of kind 'assert'"):
        _module(train_path=_data(tmp_path, [TEST_GOLD])).setup("fit")
    _module(train_path=_data(tmp_path, ["3", "\\frac{1}{2}"])).setup("fit")  # answers load
