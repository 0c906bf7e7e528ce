"""``judge:<template>``: an LLM asked with a template, its reply parsed.

The template is filled as documented, each parser accepts what it should and refuses the rest,
a reply without a well-formed verdict scores the judge's minimum (counted as penalized). The
judging LLM is the policy (a tiny random model through the HF engine, handed over as the trainer
does) or a separate tiny model made in code whose greedy reply is always "1". The attacks on
verdicts and on the judge's limits are in test_untrusted_text.py.
"""
from __future__ import annotations

import logging

import pytest

from ibpo_lit.data.prompt import Prompt
from ibpo_lit.errors import ConfigError
from ibpo_lit.model_rewards import (
    JUDGE_TEMPLATES,
    InTrainerPool,
    Judge,
    JudgeOptions,
    ModelRewardContext,
    check_model_reward,
    get_parser,
)
from ibpo_lit.models.tiny import build_tiny_model, build_tiny_tokenizer
from ibpo_lit.rewards import RewardSpec
from ibpo_lit.rewards.functions import reward_label
from ibpo_lit.rollout.hf import HFRolloutEngine
from ibpo_lit.rollout.engine import SamplingConfig

from model_reward_fixtures import save_constant_judge


class ScriptedEngine:
    """A stand-in for the rollout engine's generate: records each call, replies from a script."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.calls = tokenizer, list(replies), []

    def generate(self, prompts, n, seeds, sampling=None):
        self.calls.append({"prompts": [list(p) for p in prompts], "n": n, "seeds": list(seeds), "sampling": sampling})
        return Replies([self.tokenizer(self.replies.pop(0), add_special_tokens=False).input_ids for _ in prompts])


class Replies:
    """What the judge reads of a `RolloutBatch`: each row's response token ids."""

    def __init__(self, rows):
        self.rows = rows

    def response_lists(self):
        return self.rows


@pytest.fixture
def tokenizer():
    return build_tiny_tokenizer()


def scripted(tokenizer, replies, target="correctness", **options):
    engine = ScriptedEngine(tokenizer, replies)
    ctx = ModelRewardContext(tokenizer=tokenizer, generate=engine.generate, context_limit=8192, seed=7)
    return Judge(target, ctx, JudgeOptions(**options)), engine


# ---------------------------------------------------------------- the template
def test_the_template_is_filled_and_asked_as_one_user_turn(tokenizer):
    judge, engine = scripted(tokenizer, ["YES", "no"])
    assert judge(["What is 2+3?", "Add 1 and 1."], ["It is 5", "It is 3"], gold=["5", "2"]) == [1.0, 0.0]
    question = ("You are grading a response to a problem against the reference answer.\n\n"
                "Problem:\nWhat is 2+3?\n\nReference answer:\n5\n\nResponse:\nIt is 5\n\n"
                "Is the response's final answer equal to the reference answer? Reply with YES or NO only.")
    assert judge.question("What is 2+3?", "It is 5", "5") == question
    chat = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    (call,) = engine.calls
    assert call["prompts"][0] == tokenizer(chat, add_special_tokens=False).input_ids
    assert call["n"] == 1 and len(call["seeds"]) == 2
    assert call["sampling"].top_k == 1 and call["sampling"].max_new_tokens == 16  # greedy
    assert judge.last_replies == ["YES", "no"]


def test_seeds_follow_the_question_not_its_place_in_the_batch(tokenizer):
    judge, engine = scripted(tokenizer, ["yes"] * 3)
    judge(["a", "b"], ["r1", "r2"], gold=["1", "2"])
    judge(["b"], ["r2"], gold=["2"])
    assert engine.calls[0]["seeds"][1] == engine.calls[1]["seeds"][0]
    assert engine.calls[0]["seeds"][0] != engine.calls[0]["seeds"][1]


def test_a_missing_gold_is_unscorable(tokenizer):
    judge, engine = scripted(tokenizer, ["YES"])
    assert judge(["p", "q"], ["r", "s"], gold=[None, "1"]) == [None, 1.0]
    assert len(engine.calls[0]["prompts"]) == 1
    judge2, engine2 = scripted(tokenizer, [])
    assert judge2([], [], gold=[]) == [] and engine2.calls == []  # no rank has a question: none asks
    judge3, _ = scripted(tokenizer, ["8"], target="score")  # no {gold}: a record without one is judged
    assert judge3(["p"], ["r"], gold=[None]) == [0.8]


def test_template_errors_name_the_placeholder(tmp_path):
    def spec(text, **options):
        path = tmp_path / "t.txt"
        path.write_text(text)
        return RewardSpec(f"judge:{path}", options=options or {"parser": "yes_no"})

    check_model_reward(spec("Q: {problem}\nA: {response}\nGold: {gold}\n{{literal}}"))
    with pytest.raises(ConfigError, match=r"has no \{response\} placeholder"):
        check_model_reward(spec("Q: {problem}"))
    with pytest.raises(ConfigError, match=r"unknown placeholder \{answer\}.*valid: \{problem\}, \{response\}, \{gold\}"):
        check_model_reward(spec("{problem} {response} {answer}"))
    with pytest.raises(ConfigError, match=r"holds \{\}"):
        check_model_reward(spec("{problem} {response} {}"))
    with pytest.raises(ConfigError, match="braces do not parse"):
        check_model_reward(spec("{problem} {response} {"))
    with pytest.raises(ConfigError, match="a template from a file needs options.parser"):
        check_model_reward(spec("{problem} {response}", max_new_tokens=4))
    with pytest.raises(ConfigError, match="not a built-in judge template .*correctness, score.* nor a template file"):
        check_model_reward(RewardSpec("judge:nonsense"))
    with pytest.raises(ConfigError, match="has no option 'temperature'; its options: model, parser, score_range, label, "
                                          "max_new_tokens, max_question_tokens, batch_size, time_limit_s"):
        check_model_reward(RewardSpec("judge:correctness", options={"temperature": 0}))
    with pytest.raises(ConfigError, match="unknown judge parser 'maybe'"):
        check_model_reward(RewardSpec("judge:correctness", options={"parser": "maybe"}))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_model_reward(RewardSpec("judge:correctness", options={"model": str(tmp_path / "no-model")}))
    assert reward_label("judge:correctness") == "judge_correctness" and reward_label(f"judge:{tmp_path}/t.txt") == "judge_t"
    assert sorted(JUDGE_TEMPLATES.names()) == ["correctness", "score"]


# ---------------------------------------------------------------- the parsers
@pytest.mark.parametrize("parser, reply, expected", [
    ("yes_no", "YES", 1.0), ("yes_no", "no.", 0.0), ("yes_no", " **Yes**, it is right", 1.0), ("yes_no", "No, not 5", 0.0),
    ("yes_no", " Yes, not no", None), ("yes_no", "No, yes", None),  # both words: no verdict
    ("yes_no", "maybe", None), ("yes_no", "Yesterday", None), ("yes_no", "", None),
    ("score_0_1", "0.7", 0.7), ("score_0_1", " 1.", 1.0), ("score_0_1", "score: 1", None), ("score_0_1", "1.5", None),
    ("score_0_1", "-0.2", None), ("score_0_1", "none", None),
    ("score_0_10", "7/10", 0.7), ("score_0_10", "10", 1.0), ("score_0_10", "11", None), ("score_0_10", "ten", None),
])
def test_parsers_accept_and_refuse(parser, reply, expected):
    assert get_parser(parser)(reply) == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize("pattern, reply, expected", [
    (r"Score: (\d+)", "Score: 3 of 5", 3.0), (r"Score: (\d+)", "3", None), (r"Score: (\d+)", "Score: 3, Score: 5", None),
    (r"\d\.\d", "about 0.5", 0.5), (r"grade (\w+)", "grade A", None), (r"Score: (\d+)", "Score: 11", None),
])
def test_a_regex_parser_reads_its_one_match_within_its_range(pattern, reply, expected):
    parser = get_parser("regex:" + pattern, score_range=[0, 10])
    assert parser(reply) == (pytest.approx(expected) if expected is not None else None)
    assert (parser.low, parser.high) == (0.0, 10.0)


def test_bad_parsers_are_refused():
    with pytest.raises(ConfigError, match="does not compile"):
        get_parser("regex:(", score_range=[0, 1])
    with pytest.raises(ConfigError, match="valid: score_0_1, score_0_10, yes_no, or regex:<pattern>"):
        get_parser("likert")
    with pytest.raises(ConfigError, match="a regex parser needs options.score_range"):
        get_parser(r"regex:(\d+)")
    with pytest.raises(ConfigError, match=r"'yes_no' has its own range \[0, 1\]"):
        get_parser("yes_no", score_range=[0, 5])
    for bad in ([1, 0], [0], [0, float("inf")], ["0", "1"], [True, 2]):
        with pytest.raises(ConfigError, match="score_range must be"):
            get_parser(r"regex:(\d+)", score_range=bad)
    with pytest.raises(ConfigError, match="label must be a word"):
        check_model_reward(RewardSpec("judge:correctness", options={"label": "Verdict:"}))
    with pytest.raises(ConfigError, match="time_limit_s must be"):
        check_model_reward(RewardSpec("judge:correctness", options={"time_limit_s": 0}))


def test_a_reply_without_a_verdict_scores_the_minimum_and_is_counted(tokenizer, caplog):
    judge, _ = scripted(tokenizer, ["YES", "I am not sure", "NO"])
    pool = InTrainerPool("judge:correctness", judge)
    with caplog.at_level(logging.WARNING):
        assert pool.score([("a", "1"), ("b", "1"), ("c", "1")], ["p", "q", "r"]) == [1.0, 0.0, 0.0]
    assert pool.stats == {"ok": 3, "timeout": 0, "error": 0, "none": 0, "penalized": 1} and pool.last_penalized == 1
    assert "a reply without a well-formed verdict ('I am not sure') scores the judge's minimum 0" in caplog.text


# ---------------------------------------------------------------- real tiny models
def test_the_policy_as_judge_through_the_hf_engine_is_deterministic():
    model, tokenizer = build_tiny_model(seed=1), build_tiny_tokenizer()
    engine = HFRolloutEngine(model, [2], 2, SamplingConfig(temperature=1.0, max_new_tokens=8))
    ctx = ModelRewardContext(tokenizer=tokenizer, generate=engine.generate, context_limit=8192)
    judge = Judge("correctness", ctx, JudgeOptions(max_new_tokens=6))
    problems, responses, golds = ["2+3?", "1+1?", "9-4?"], ["5", "3", "it is 5"], ["5", "2", "5"]
    judge(problems, responses, gold=golds)
    together = list(judge.last_replies)
    alone = []
    for p, r, g in zip(problems[::-1], responses[::-1], golds[::-1]):
        judge([p], [r], gold=[g])
        alone.append(judge.last_replies[0])
    assert together == alone[::-1] and all(isinstance(r, str) for r in together)
    # greedy: the reply is the argmax continuation, whatever the seed
    prompt = judge.encode(judge.question(problems[0], responses[0], golds[0]))
    greedy = engine.generate([prompt], n=1, seeds=[12345], sampling=SamplingConfig(top_k=1, max_new_tokens=6))
    assert tokenizer.batch_decode(greedy.response_lists(), skip_special_tokens=True)[0] == together[0]


def test_a_separate_judge_model_by_path(tmp_path):
    folder = save_constant_judge(tmp_path / "judge-model", reply="1")
    judge = Judge("correctness", ModelRewardContext(),
                  JudgeOptions(model=str(folder), parser="score_0_1", max_new_tokens=1))
    assert judge(["2+3?", "1+1?", "x"], ["5", "3", "y"], gold=["5", "2", None]) == [1.0, 1.0, None]
    assert judge.last_replies == ["1", "1", None]
    many = Judge("score", ModelRewardContext(), JudgeOptions(model=str(folder), max_new_tokens=3))
    assert many(["p"], ["r"]) == [0.0]  # "111" is no score in [0, 10]: the judge's minimum, penalized
    assert many.last_replies == ["111"] and many.last_report.penalized == 1


def test_the_module_hands_the_policy_judge_its_engine_and_tokenizer():
    from ibpo_lit.module import IBPOModule

    module = IBPOModule(rewards=[RewardSpec("math"), RewardSpec("judge:correctness", 0.0, {"max_new_tokens": 4})])
    module.configure_model()
    asked = []
    generate = module.engine.generate
    module.engine.generate = lambda *a, **k: asked.append(a[0]) or generate(*a, **k)
    prompts = [Prompt(prompt_ids=[5, 6], problem="What is 2+3?", gold="5")] * 2
    rewards = module.score(["#### 5", "#### 4"], prompts)
    assert rewards.tolist() == [1.0, 0.0]  # the judge has weight 0: math alone
    judge_pool = module._reward_pool.pools[1]
    assert judge_pool.fn.tokenizer is module.tokenizer and len(asked) == 1 and len(asked[0]) == 2
    assert asked[0][0] == judge_pool.fn.encode(judge_pool.fn.question("What is 2+3?", "#### 5", "5"))
    assert set(module._reward_pool.last_parts) == {"math", "judge_correctness"}
    module.teardown("fit")
