"""The task registry (`ibpo_lit.tasks`): each built-in task's answers, the rewards -> task link,
and a task of the user's own reaching data, corrections and scoring without a branch on its name."""
import pytest

from ibpo_lit.data.correction_prompt import CorrectionPrompt
from ibpo_lit.data.datamodule import PromptDataModule
from ibpo_lit.evaluation.scoring import score_samples
from ibpo_lit.models.loading import load_tokenizer
from ibpo_lit.rewards import REWARDS, RewardPool
from ibpo_lit.rewards.code import CodeTests
from ibpo_lit.tasks import (
    CODE_INSTRUCTION,
    TASKS,
    AnswerTask,
    CodeSandboxPool,
    CorrectionWording,
    get_task,
    scoring_pool,
    task_for_rewards,
)


def test_built_in_tasks_answer_what_the_rooms_ask():
    math, code, custom = get_task("math"), get_task("code"), get_task("custom")
    assert (math.reward, math.needs_gold, math.runs_programs) == ("math", True, False)
    assert (code.reward, code.needs_gold, code.runs_programs) == ("code", True, True)
    assert (custom.reward, custom.needs_gold) == (None, False)
    assert "####" in math.instruction and code.instruction == CODE_INSTRUCTION
    assert math.final_answer("so #### 0.5") == "1/2" and code.final_answer("#### 3") is None
    with pytest.raises(ValueError, match="unknown task 'lean'; valid: code, custom, math"):
        get_task("lean")


def test_each_task_words_its_correction():
    wording = CorrectionWording(template="CMP", code_template="CODE-CMP", answer_instruction=None)
    attempt = "Here:\n```python\ndef f():\n    return 1\n```\nthanks"
    math_text = get_task("math").correction_text(wording, "p", attempt, "b", "Answer after ####.")
    assert math_text.startswith("CMP") and "thanks" in math_text and math_text.endswith("Answer after ####.")
    code_text = get_task("code").correction_text(wording, "p", attempt, "x = 1", None)
    assert code_text.startswith("CODE-CMP") and "thanks" not in code_text  # the program alone
    assert "```python\nx = 1\n```" in code_text


def test_each_reward_is_scored_in_its_tasks_pool():
    with scoring_pool("code", num_workers=1) as pool:
        assert isinstance(pool, CodeSandboxPool)
    with scoring_pool("math", num_workers=1, timeout_s=5) as pool:
        assert isinstance(pool, RewardPool) and pool.reward == "math" and pool.timeout_s == 5
    with pytest.raises(ValueError, match="no verifier of its own"):
        get_task("custom").scoring_pool(1, 5.0)


@pytest.mark.parametrize("reward, rewards, task", [
    (None, None, "math"), ("math", None, "math"), ("code", None, "code"), ("pkg.mod:fn", None, "custom"),
    (None, [{"name": "math"}, {"name": "code", "weight": 0.5}], "code"),
    (None, [{"name": "math"}, {"name": "pkg.mod:fn"}], "math"),
])
def test_the_data_task_follows_the_rewards(reward, rewards, task):
    assert task_for_rewards(reward, rewards) == task


@pytest.fixture
def trivia_task():
    """A task of the user's own: answer-style, its own instruction, scored by the math verifier."""
    task = AnswerTask("trivia", reward="math", instruction="Answer in one word after ####.")
    TASKS.register("trivia")(task)
    yield task
    TASKS._entries.pop("trivia")


def test_a_task_of_your_own_reaches_data_corrections_and_scoring(trivia_task, tmp_path):
    data = tmp_path / "t.jsonl"
    data.write_text('{"question": "Capital of France?", "answer": "#### 7"}\n')
    dm = PromptDataModule(train_path=str(data), task="trivia")
    dm.tokenizer_obj = load_tokenizer("tiny-llama")
    dm.setup()
    prompt = next(iter(dm.train_dataset()))
    assert prompt.task == "trivia" and prompt.meta["instruction"] == "Answer in one word after ####."
    text = CorrectionPrompt().text(prompt.problem, "7", "8", prompt.meta["instruction"], task=prompt.task)
    assert text.endswith("Answer in one word after ####.")
    verdicts = score_samples("trivia", [["#### 7", "#### 8"]], ["7"], workers=1)
    assert verdicts.scores == [[1.0, 0.0]] and verdicts.statuses is None
    assert "trivia" not in REWARDS  # a task names a verifier; it is not one


def test_code_samples_are_judged_with_tests_passed_and_status():
    gold = CodeTests(tests=("assert f() == 1", "assert f() == 2"), remote=("f",)).to_gold()
    verdicts = score_samples("code", [["def f():\n    return 1\n"]], [gold], workers=1)
    assert verdicts.scores == [[0.0]] and verdicts.test_fracs == [[0.5]] and verdicts.statuses == [["fail"]]
