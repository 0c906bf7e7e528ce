"""Your own data through the command line: each mistake ends ``python -m ibpo_lit fit`` with one
line naming the file, line, field and the setting that fixes it, before any weights load; a
conversational file and a prompt-only file with a reward of your own train end to end on the
tiny model. The record-level rules are in test_prompt_only_and_conversations.py."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import ibpo_lit.module
from ibpo_lit.__main__ import entry_point, main

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")
HAIKUS = [{"prompt": "Write a haiku", "topic": "sea"}, {"prompt": "Write a limerick", "topic": "cat"}]
CONVERSATIONS = [
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 2?"}],
     "answer": "3"},
    {"prompt": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"},
                {"role": "user", "content": "Times 2?"}], "answer": "8"},
]

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")  # (tests/conftest.py)


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _fit_args(tmp_path, data: Path, *overrides: str, steps: int = 1) -> list[str]:
    return ["fit", "--config", TINY, "--trainer.max_steps", str(steps), "--trainer.default_root_dir",
            str(tmp_path / "run"), "--trainer.enable_progress_bar", "false", "--data.train_path", str(data),
            *overrides]


def _one_line_error(capsys, monkeypatch, args: list[str]) -> str:
    def refuse(*a, **k):
        raise AssertionError("weights were loaded before the error was reported")

    monkeypatch.setattr(ibpo_lit.module, "load_policy", refuse)
    monkeypatch.delenv("IBPO_LIT_DEBUG", raising=False)
    assert entry_point(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    return err[-1]


def test_prompt_only_data_with_the_math_reward(tmp_path, capsys, monkeypatch):
    data = _write(tmp_path / "haikus.jsonl", HAIKUS)
    assert _one_line_error(capsys, monkeypatch, _fit_args(tmp_path, data)) == (
        f"ibpo-lit: error: {data}:1: field 'question': missing (the record has fields [prompt, topic]: "
        "set data.question_key: prompt)")
    assert _one_line_error(capsys, monkeypatch, _fit_args(tmp_path, data, "--data.question_key", "prompt")) == (
        f"ibpo-lit: error: {data}:1: field 'answer': missing (the record has fields [prompt, topic]; the built-in "
        "verifiers (math, code) score each response against it: set data.answer_key to the field that holds the "
        "answer, or score with a reward function of your own (model.reward: package.module:function), which "
        "needs none)")
    args = _fit_args(tmp_path, data, "--data.question_key", "prompt", "--data.answer_key", "null")
    assert _one_line_error(capsys, monkeypatch, args) == (
        "ibpo-lit: error: data.answer_key: null (records without an answer) leaves the 'math' verifier nothing to "
        "score responses against: set data.answer_key to the field with the answer, or score with a reward "
        "function of your own (model.reward: package.module:function)")


def test_plain_answers_without_answer_format_plain(tmp_path, capsys, monkeypatch):
    data = _write(tmp_path / "math.jsonl", [{"problem": "1 + 2?", "answer": "3"}])
    args = _fit_args(tmp_path, data, "--data.question_key", "problem")
    assert _one_line_error(capsys, monkeypatch, args) == (
        f"ibpo-lit: error: {data}:1: field 'answer': no '####' before the final answer (if this field holds the "
        "final answer itself, as in MATH-500 or AIME, set data.answer_format: plain)")


def test_a_bad_conversation(tmp_path, capsys, monkeypatch):
    bad = [CONVERSATIONS[0], {"prompt": [{"role": "user", "content": "1?"}, {"role": "model", "content": "2"}],
                              "answer": "2"}]
    data = _write(tmp_path / "chat.jsonl", bad)
    args = _fit_args(tmp_path, data, "--data.question_key", "prompt", "--data.answer_format", "plain")
    assert _one_line_error(capsys, monkeypatch, args) == (
        f"ibpo-lit: error: {data}:2: field 'prompt': message 2: 'role' must be one of 'system', 'user', "
        "'assistant', got 'model'")


@pytest.mark.slow
def test_a_conversational_file_trains_with_corrections(tmp_path):
    """tiny.yaml's IBPO: the correction prompts quote the conversations too."""
    data = _write(tmp_path / "chat.jsonl", CONVERSATIONS)
    cli = main(_fit_args(tmp_path, data, "--data.question_key", "prompt", "--data.answer_format", "plain"))
    assert cli.trainer.global_step == 1
    prompts = next(iter(cli.datamodule.train_dataloader()))  # the next step's: both records again
    tokenizer = cli.datamodule.tokenizer_obj
    assert sorted(tokenizer.decode(p.prompt_ids) for p in prompts) == sorted([
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1 + 2?\n\nGive the final answer after "
        "####.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nTimes 2?\n\n"
        "Give the final answer after ####.<|im_end|>\n<|im_start|>assistant\n"])
    logged = cli.trainer.logged_metrics
    assert "train/correction_success" in logged and float(logged["train/unscorable"]) == 0.0


@pytest.mark.slow
def test_prompt_only_data_trains_with_a_reward_of_your_own(tmp_path):
    """The command line as a user runs it: ``model.reward: pkg:fn`` makes ``data.task: custom``."""
    data = _write(tmp_path / "haikus.jsonl", HAIKUS)
    reward = "own_data_rewards:inputs_as_documented"
    cli = main(_fit_args(tmp_path, data, "--model.reward", reward, "--data.question_key", "prompt",
                         "--data.instruction", "", steps=2))
    assert cli.datamodule.task == "custom" and cli.trainer.global_step == 2
    logged = cli.trainer.logged_metrics
    # every response scored 1.0: the reward got the problem texts, gold None, answer None, the topics
    assert float(logged["train/reward"]) == 1.0 and float(logged["train/unscorable"]) == 0.0
    assert float(logged["reward/inputs_as_documented"]) == 1.0
