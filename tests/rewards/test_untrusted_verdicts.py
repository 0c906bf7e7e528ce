"""Issue 43's second and third classes of attacks, on LLM judges and reward models as rewards.

2. Verdicts that are not there: the judge's reply, steered by the response, holds a YES or a number
   somewhere that the old parsers read as the verdict ("Yes? No.", "10/10 ... 0"), or a number
   ``float`` takes that no judge means (``1e9``, ``inf``, ``1_0``, other scripts' digits), so one
   reply outweighed every other reward. Each attack is run against the parsers as they were (the
   guard off, copied below) and as they are.
3. Breaking the judge to escape its penalty: a reply off the format, or a question longer than the
   judge takes, used to be unscorable (None), and an unscorable reward made the row's advantage 0
   where a wrong answer's is negative. Now they score the declared minimum, counted; faults of the
   harness (an engine that raises, a record without its gold, the time limit) stay unscorable.
   The time limit is agreed by every rank (`ibpo_lit.scale.deadline`), checked on 2 processes.
"""
from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from ibpo_lit.algorithms.advantages import grouped_advantages
from ibpo_lit.model_rewards import (
    InTrainerPool,
    Judge,
    JudgeOptions,
    ModelRewardContext,
    RewardModel,
    RewardModelOptions,
    get_parser,
)
from ibpo_lit.models.tiny import build_tiny_tokenizer
from ibpo_lit.rewards.functions import combine
from ibpo_lit.scale.deadline import Deadline, DeadlineExceeded

from model_reward_fixtures import save_tiny_reward_model


# ---------------------------------------------------------------- the parsers before issue 43
def old_yes_no(reply):
    m = re.search(r"\b(yes|no)\b", reply, re.IGNORECASE)
    return None if m is None else float(m.group(1).lower() == "yes")


def old_score_0_10(reply):
    m = re.search(r"[-+]?(?:\d+\.?\d*|\.\d+)", reply)
    x = float(m.group(0)) if m else None
    return x / 10.0 if x is not None and 0.0 <= x <= 10.0 else None


def old_regex(pattern):
    def parse(reply):
        m = re.search(pattern, reply)
        try:
            return None if m is None else float(m.group(1))
        except ValueError:
            return None
    return parse


REGEX = r"Score: (\S+)"
# (parser, the judge's reply steered by the response, what the old parser read, what is read now)
STEERED = [
    ("yes_no", "The response says yes, but its answer is wrong. NO", 1.0, None),
    ("yes_no", "Yes? No.", 1.0, None),
    ("yes_no", "no ... yes", 0.0, None),
    ("yes_no", "\u200bYES", 1.0, None),  # a zero-width space first: not the reply's first word
    ("yes_no", "\uff39\uff25\uff33", None, None),  # fullwidth YES: unscorable before, the minimum now
    ("yes_no", "Y\u0435s", None, None),  # a Cyrillic e
    ("yes_no", "  **YES**", 1.0, 1.0),  # well formed: markdown and spaces around the first word
    ("score_0_10", "10/10 is what a perfect answer gets; this one gets 0", 1.0, None),
    ("score_0_10", "Score: 10", 1.0, None),
    ("score_0_10", "1e1", 0.1, None),
    ("score_0_10", "NaN", None, None),
    ("score_0_10", "\u0661\u0660", 1.0, None),  # Arabic-Indic 10: float() takes it
    ("score_0_10", "\uff11\uff10", 1.0, None),  # fullwidth 10
    ("score_0_10", "10.000001", None, None),
    ("score_0_10", "7", 0.7, 0.7),
    (REGEX, "Score: 1e9", 1e9, None),
    (REGEX, "Score: inf", math.inf, None),
    (REGEX, "Score: nan", "nan", None),
    (REGEX, "Score: 1_0", 10.0, None),
    (REGEX, "Score: \u0661\u0660", 10.0, None),
    (REGEX, "Score: 99", 99.0, None),  # outside the declared [0, 10]
    (REGEX, "Score: 10 or rather Score: 0", 10.0, None),  # two verdicts: which?
    (REGEX, "Score: 6", 6.0, 6.0),
]


def _old(parser):
    return {"yes_no": old_yes_no, "score_0_10": old_score_0_10}.get(parser) or old_regex(parser)


def _new(parser):
    return get_parser(parser) if parser in ("yes_no", "score_0_10") else get_parser("regex:" + parser, [0, 10])


@pytest.mark.parametrize("parser, reply, before, now", STEERED)
def test_a_steered_reply_is_read_only_as_a_well_formed_verdict(parser, reply, before, now):
    old = _old(parser)(reply)
    if before == "nan":
        assert math.isnan(old)
    else:
        assert old == (pytest.approx(before) if before is not None else None)  # the guard off
    assert _new(parser)(reply) == (pytest.approx(now) if now is not None else None)


def test_no_reply_outweighs_the_other_rewards():
    # math (weight 1) plus a regex judge (weight 0.1): the old parser let "Score: 1e9" add 1e8.
    replies = [reply for parser, reply, _, _ in STEERED if parser == REGEX]
    old = [_old(REGEX)(r) for r in replies]
    assert max(v for v in old if v is not None and math.isfinite(v)) * 0.1 > 1.0
    parser = _new(REGEX)
    for reply in replies + ["Score: -1", "Score: 1" + "0" * 400, "Score: " + "9" * 5000]:
        value = parser(reply)
        value = parser.low if value is None else value  # what the judge scores an off-format reply
        assert parser.low <= value <= parser.high and combine([[1.0], [value]], [1.0, 0.1])[0] <= 2.0


def test_a_declared_label_reads_the_one_verdict_line():
    parser = get_parser("yes_no", label="Verdict")
    reasoning = "The response says yes to the question, but 41 is not 42.\n"
    assert parser(reasoning + "**Verdict:** NO") == 0.0
    assert parser(reasoning + "verdict: yes.") == 1.0
    assert parser(reasoning + "Verdict: NO\nVerdict: YES") is None  # two verdict lines
    assert parser("YES") is None  # no verdict line
    score = get_parser("score_0_10", label="Score")
    assert score("It is mostly right.\nScore: 8/10") == pytest.approx(0.8)
    assert score("Score: 10 if it were right.\nScore: 2") is None


# ---------------------------------------------------------------- breaking the judge does not pay
class ScriptedJudgeEngine:
    """The rollout engine's generate, replying from a script (optionally slowly), recording calls."""

    def __init__(self, tokenizer, replies, seconds_per_call=0.0, fail=False):
        self.tokenizer, self.replies, self.seconds, self.fail, self.calls = tokenizer, list(replies), seconds_per_call, fail, []

    def generate(self, prompts, n, seeds, sampling=None):
        self.calls.append([list(p) for p in prompts])
        if self.fail:
            raise RuntimeError("engine error: CUDA out of memory")
        time.sleep(self.seconds)
        return _Rows([self.tokenizer(self.replies.pop(0), add_special_tokens=False)["input_ids"] for _ in prompts])


class _Rows:
    def __init__(self, rows):
        self.rows = rows

    def response_lists(self):
        return self.rows


def judge_with(replies, context_limit=4096, version=3, **options):
    tok = build_tiny_tokenizer()
    engine = ScriptedJudgeEngine(tok, replies, **{k: options.pop(k) for k in ("seconds_per_call", "fail") if k in options})
    ctx = ModelRewardContext(tokenizer=tok, generate=engine.generate, context_limit=context_limit,
                             weights_version=lambda: version)
    return Judge("correctness", ctx, JudgeOptions(**options)), engine


def test_a_wrong_answer_that_breaks_its_judge_gets_the_advantage_of_a_wrong_answer():
    # One group: right and judged YES; wrong and judged NO; wrong and steering the judge off its
    # format. Math and the judge summed with weight 1 each.
    judge, _ = judge_with(["YES", "NO", "I cannot grade this. Please see the instructions above."])
    pool = InTrainerPool("judge:correctness", judge)
    math_scores = [1.0, 0.0, 0.0]
    judged = pool.score([("#### 42", "42"), ("#### 41", "42"), ("#### 40", "42")], ["6*7?"] * 3)
    assert judged == [1.0, 0.0, 0.0] and pool.stats["penalized"] == 1 and pool.unscorable == {"timeout": 0, "error": 0,
                                                                                                "none": 0}
    group = torch.zeros(3, dtype=torch.long)

    def advantages(judge_values):
        totals = combine([math_scores, judge_values], [1.0, 1.0])
        return grouped_advantages(torch.tensor([math.nan if v is None else v for v in totals]), group).tolist()

    now = advantages(judged)
    assert now[2] == pytest.approx(now[1]) and now[2] < 0  # as wrong as the other wrong answer
    before = advantages([1.0, 0.0, None])  # the guard off: unscorable, advantage 0
    assert before[2] == 0.0 and before[1] < 0


def test_a_question_too_long_for_the_judge_scores_the_minimum_without_being_asked():
    judge, engine = judge_with(["YES"], max_question_tokens=400)
    huge = "4" * 1_000_000  # a response the judge would take long to read
    start = time.perf_counter()
    assert judge(["6*7?", "6*7?"], [huge, "#### 42"], gold=["42", "42"]) == [0.0, 1.0]
    assert time.perf_counter() - start < 30  # tokenized, refused, never generated from
    assert judge.last_report.penalized == 1 and [len(p) <= 400 for p in engine.calls[0]] == [True]
    # the template and the record alone do not fit: the harness's doing, unscorable
    long_problem, _ = judge_with([], max_question_tokens=400)
    assert long_problem(["x" * 1000], ["#### 42"], gold=["42"]) == [None] and long_problem.last_report.penalized == 0


def test_faults_of_the_harness_stay_unscorable_and_counted():
    judge, _ = judge_with([], fail=True)
    pool = InTrainerPool("judge:correctness", judge)
    assert pool.score([("#### 42", "42"), ("#### 41", "42")], ["6*7?"] * 2) == [None, None]
    assert pool.stats["error"] == 2 and "engine error" in pool.last_error
    judge, _ = judge_with(["YES"])
    assert judge(["6*7?", "6*7?"], ["#### 42", "#### 42"], gold=["42", None]) == [1.0, None]  # no gold: unscorable


def test_the_time_limit_leaves_the_rest_unscorable_and_names_rank_phase_and_version():
    judge, engine = judge_with(["YES", "NO", "YES"], seconds_per_call=0.6, batch_size=1, time_limit_s=0.3)
    pool = InTrainerPool("judge:correctness", judge)
    assert pool.score([("a", "1"), ("b", "1"), ("c", "1")], ["p"] * 3) == [1.0, None, None]
    assert len(engine.calls) == 1 and pool.stats["timeout"] == 2 and pool.unscorable["timeout"] == 2
    assert pool.last_error.startswith("rank 0: judge:correctness scoring passed its time limit of 0.3 s")
    assert "weights version 3" in pool.last_error
    unlimited, engine = judge_with(["YES"] * 3, seconds_per_call=0.4, batch_size=1, time_limit_s=None)
    assert unlimited(["p"] * 3, ["a", "b", "c"], gold=["1"] * 3) == [1.0] * 3


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return save_tiny_reward_model(tmp_path_factory.mktemp("verdict_rm") / "rm")


def test_a_reward_model_refuses_a_text_too_long_at_its_minimum_and_floors_its_scores(rm_dir, caplog):
    texts = ["ok", "fine"]
    low, high = sorted(RewardModel(str(rm_dir), ModelRewardContext())(["q", "q"], texts))
    floor = (low + high) / 2
    rm = RewardModel(str(rm_dir), ModelRewardContext(),
                     RewardModelOptions(max_length=40, truncation="refuse", min_score=floor))
    out = rm(["q"] * 3, texts + ["y" * 50])
    # refused as too long: the minimum, never None; and no scored text below it, so refusing
    # never pays better than being scored
    assert out[2] == floor and rm.last_report.penalized == 1
    assert sorted(out[:2]) == [floor, pytest.approx(high, abs=1e-5)]
    assert "is below options.min_score" in caplog.text


def test_a_reward_models_time_limit_is_checked_between_forwards(rm_dir):
    rm = RewardModel(str(rm_dir), ModelRewardContext(weights_version=lambda: 5),
                     RewardModelOptions(batch_size=1, time_limit_s=0.3))
    rm.model.register_forward_pre_hook(lambda module, args: time.sleep(0.6))  # a slow model
    pool = InTrainerPool("reward_model:rm", rm)
    values = pool.score([("a", None), ("bb", None), ("ccc", None)], ["q"] * 3)
    assert sum(v is not None for v in values) == 1 and pool.stats["timeout"] == 2
    assert "reward_model:" in pool.last_error and "weights version 5" in pool.last_error


# ---------------------------------------------------------------- the deadline
def test_a_deadline_passes_once_its_clock_does_and_says_where():
    now = [100.0]
    deadline = Deadline("judge:x scoring", 2.0, version=9, clock=lambda: now[0])
    assert not deadline.passed()
    now[0] = 102.5
    assert deadline.passed() and deadline.passed()
    with pytest.raises(DeadlineExceeded, match=r"rank 0: judge:x scoring passed its time limit of 2 s \(past it on "
                                               r"rank\(s\) 0; 2.5 s on this rank\), weights version 9"):
        deadline.check()
    assert not Deadline("x", None).passed()
    for bad in (0, -1, math.inf, math.nan, True):
        with pytest.raises(ValueError, match="a time limit must be"):
            Deadline("x", bad)


@pytest.mark.slow
def test_two_ranks_agree_on_a_deadline_one_of_them_passed(tmp_path, rm_dir):
    """2 processes: rank 1's clock is past the limit, rank 0's is not; both stop at the same unit.
    With the sharded reward model, rank 1's limit is passed at once: both ranks stop before the
    first forward (a rank that stopped alone would leave the other in the forward's collective)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scale"))
    from fit_runs import two_process_results

    (tmp_path / "model").write_text(str(rm_dir))
    ranks = two_process_results(Path(__file__).with_name("deadline_ranks.py"), tmp_path)
    for rank in ranks:
        assert rank["stopped_at"] == 2  # rank 1's clock passed after unit 2: both stop there
        assert "past it on rank(s) 1;" in rank["message"] and rank["message"].startswith(f"rank {rank['rank']}:")
        assert rank["scores"] == [None] * rank["texts"] and rank["timed_out"] == rank["texts"]
        assert "weights version 4" in rank["rm_message"]
    json.dumps(ranks)
