"""math_score (through the default pool), math_score_inprocess, GSM8K golds, the registry."""
import threading

import pytest

from ibpo_lit.rewards import (
    REWARDS,
    extract_gsm8k_gold,
    get_reward,
    math_score,
    math_score_inprocess,
)


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("She pays 3*4=<<3*4=12>>12.\n#### 12", "12"),
        ("Total 1,000+234=<<1000+234=1234>>1,234\n#### 1,234", "1234"),
        ("#### -5", "-5"),
        ("a #### 1 b\n#### 72 ", "72"),  # the last marker wins
    ],
)
def test_extract_gsm8k_gold(answer, gold):
    assert extract_gsm8k_gold(answer) == gold


def test_extract_gsm8k_gold_without_marker():
    with pytest.raises(ValueError, match="####"):
        extract_gsm8k_gold("the answer is 3")


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("7 + 4 = 11\n#### 11", "11", 1.0),
        ("7 + 4 = 12\n#### 12", "11", 0.0),
        ("#### 1,234", "1234", 1.0),
        ("#### 1234", "1234", 1.0),
        ("#### $42$ apples", "42", 1.0),
        # the #### line is read, not an earlier "answer is" phrase
        ("The answer is 41. Wait, no.\n#### 42\nSome rambling 17", "42", 1.0),
        # no #### marker: math-verify's default extraction (last boxed / last number)
        ("So the result is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("So the result is \\boxed{\\frac{1}{2}}.", "\\frac12", 1.0),
        ("So the result is \\boxed{\\frac{1}{3}}.", "\\frac{1}{2}", 0.0),
        ("#### 0.5", "\\frac{1}{2}", 1.0),
        ("12 apples and then 13, so 25.", "25", 1.0),
        # an empty #### line falls back to the whole completion
        ("the answer is \\boxed{7}\n#### ", "7", 1.0),
        # no answer at all is wrong, not unscorable
        ("I do not know.", "42", 0.0),
        ("", "42", 0.0),
        # restating the question is not answering it (math-verify alone scores these 1.0)
        ("#### 47 * 83", "3901", 0.0),
        ("#### 47*83", "3901", 0.0),
        ("47 * 83 = ####", "3901", 0.0),
        ("#### 3901 = 47*83", "3901", 0.0),
        ("#### 2+3", "5", 0.0),
        ("#### 7-2", "5", 0.0),
        ("#### 10^3", "1000", 0.0),
        # ... while the worked computation with its value, and values as written, still count
        ("#### 47 * 83 = 3901", "3901", 1.0),
        ("#### -12", "-12", 1.0),
        ("#### 3/4", "0.75", 1.0),
        ("#### -1/2", "-0.5", 1.0),
        ("#### 4/8", "0.5", 1.0),
        ("#### 2.50", "2.5", 1.0),
        ("#### 50%", "0.5", 1.0),
        ("#### x = 5", "5", 1.0),
        # a gold that is itself an expression keeps math-verify's equivalence
        ("#### $2^{10}$", "2^{10}", 1.0),
        ("#### 1024", "2^{10}", 1.0),
    ],
)
def test_math_score(completion, gold, expected):
    assert math_score(completion, gold) == expected


@pytest.mark.parametrize("gold", ["", "   ", "\\frac{", "}{"])
def test_unparseable_gold_is_unscorable(gold):
    assert math_score("#### 42", gold) is None


def test_math_verify_error_is_unscorable(monkeypatch):
    import math_verify

    def boom(*args, **kwargs):
        raise RuntimeError("sympy exploded")

    monkeypatch.setattr(math_verify, "verify", boom)  # patches this process only: the in-process scorer
    assert math_score_inprocess("#### 42", "42") is None


def test_math_score_works_off_the_main_thread():
    results = []
    t = threading.Thread(target=lambda: results.append(math_score("#### 1,234", "1234")))
    t.start()
    t.join()
    assert results == [1.0]


def test_registry():
    # the registry names the in-process scorer (what pool workers run); math_score goes through a pool
    assert get_reward("math") is math_score_inprocess
    assert "math" in REWARDS
    with pytest.raises(ValueError, match=r"unknown reward 'chess'; valid: .*math"):
        get_reward("chess")
