"""IBPO corrections' pure pieces: reference choice, the prompt, and the settings' checks."""
import math
from types import SimpleNamespace

import pytest

from ibpo_lit.config import IBPOConfig
from ibpo_lit.data.correction_prompt import CorrectionPrompt
from ibpo_lit.tasks import COMPARE_TEMPLATE as DEFAULT_TEMPLATE
from ibpo_lit.training.corrections import choose_references

nan = math.nan


def test_reference_is_a_correct_rollout_when_the_group_has_one():
    rewards = [1, 0, 0, nan, 0, 0, 0, 0, 1, 1, 1, 1]
    groups = [0] * 4 + [1] * 4 + [2] * 4
    pairs = choose_references(rewards, groups, seed=0, step=0)
    by_row = dict(pairs)
    # group 0: rows 1 and 2 are wrong, row 0 is its only correct one; row 3 is unscorable
    assert by_row[1] == 0 and by_row[2] == 0 and 3 not in by_row and 0 not in by_row
    # group 1: all wrong -> each gets another wrong row of its own group, never itself
    for i in (4, 5, 6, 7):
        assert by_row[i] in {4, 5, 6, 7} - {i}
    # group 2: all correct -> nothing to correct
    assert not {8, 9, 10, 11} & set(by_row)
    assert sorted(by_row) == [1, 2, 4, 5, 6, 7]


def test_reference_choice_is_uniform_and_reproducible():
    rewards, groups = [1, 1, 0], [0, 0, 0]
    picks = [choose_references(rewards, groups, seed=3, step=s)[0][1] for s in range(2000)]
    share = picks.count(0) / len(picks)
    assert 0.45 < share < 0.55  # binomial(2000, .5): std 0.011
    again = [choose_references(rewards, groups, seed=3, step=s)[0][1] for s in range(2000)]
    assert picks == again


def test_lone_wrong_rollout_gets_no_partner():
    assert choose_references([0, nan], [0, 0], seed=0, step=0) == []


def test_prompt_text_quotes_problem_attempt_reference_and_instruction():
    text = CorrectionPrompt().text("What is 2 + 2?", "It is 5.", "It is 4.", "Answer after ####.")
    assert text.startswith(DEFAULT_TEMPLATE)
    assert text.index("What is 2 + 2?") < text.index("It is 5.") < text.index("It is 4.") < text.index("Answer after ####.")
    overridden = CorrectionPrompt(answer_instruction="Box it.").text("p", "a", "b", "Answer after ####.")
    assert overridden.endswith("Box it.")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"alpha": 1.5}, "alpha"),
        ({"alpha": "sometimes"}, "alpha"),
        ({"corrections_per_input": 0}, "corrections_per_input"),
        ({"grouping": "input"}, "grouping"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"on_long_prompt": "cut"}, "on_long_prompt"),
        ({"variant": "maybe"}, "valid: mask, none, plain, ratio"),
        ({"lam": 2.5}, "lam"),
    ],
)
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        IBPOConfig(**kwargs)


def test_code_correction_prompt_shows_both_candidates_as_code():
    cb = CorrectionPrompt()
    attempt = "Here is my try:\n```python\ndef add(a, b):\n    return a - b\n```\nDone."
    reference = "```python\ndef add(a, b):\n    return a + b\n```"
    text = cb.text("Write add(a, b).", attempt, reference, None, task="code")
    assert text.startswith("You are given two candidate Python solutions")
    assert "Candidate solution 1:\n```python\ndef add(a, b):\n    return a - b\n```" in text
    assert "Candidate solution 2:\n```python\ndef add(a, b):\n    return a + b\n```" in text
    assert "Here is my try" not in text  # only the code is shown
    math_text = cb.text("1+1?", "2", "3", None)
    assert "```" not in math_text and "final answer" in math_text


def test_reference_draws_follow_the_global_row_whatever_the_split():
    """Two ranks drawing their halves of a batch pick what one process drawing all of it picks."""
    rewards = [1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0]
    groups = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    whole = dict(choose_references(rewards, groups, seed=5, step=7))
    halves = {}
    for rank in (0, 1):
        part = slice(8 * rank, 8 * rank + 8)
        local_groups = [g - 2 * rank for g in groups[part]]
        for i, ref in choose_references(rewards[part], local_groups, seed=5, step=7, rank=rank):
            halves[i + 8 * rank] = ref + 8 * rank
    assert halves == whole and len(whole) == 11


class _CharTokenizer:
    """One token per character (enough for the length arithmetic of the truncation)."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True, split_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}  # no special tokens: nothing to split

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_long_correction_prompts_are_cut_in_the_middle_of_each_candidate():
    tok = _CharTokenizer()
    prompt = SimpleNamespace(problem="What is 6 x 7?", meta={}, task="math")
    attempt = "START-A " + "a" * 2000 + " the answer is 41 #### 41"
    reference = "START-B " + "b" * 3000 + " the answer is 42 #### 42"
    cb = CorrectionPrompt()
    full, _ = cb.bounded_ids(tok, prompt, attempt, reference, budget=None)
    ids, truncated = cb.bounded_ids(tok, prompt, attempt, reference, budget=1500)
    assert truncated and len(ids) <= 1500 < len(full)
    text = tok.decode(ids)
    for kept in ("START-A", "#### 41", "START-B", "#### 42", "What is 6 x 7?"):
        assert kept in text  # the openings, the final answers and the problem survive
    assert text.count("tokens omitted") == 2
    assert cb.bounded_ids(tok, prompt, attempt, reference, budget=len(full)) == (full, False)
    skipping = CorrectionPrompt(on_long_prompt="skip")
    assert skipping.bounded_ids(tok, prompt, attempt, reference, budget=1500) == (None, False)
    assert cb.bounded_ids(tok, prompt, attempt, reference, budget=10) == (None, False)  # no room at all
