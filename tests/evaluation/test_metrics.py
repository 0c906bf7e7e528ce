"""avg@k, pass@k and maj@k against hand-derived values and brute-force enumeration."""
from itertools import combinations
from math import comb

import pytest
import torch

from ibpo_lit.rewards.answers import extract_answer
from ibpo_lit.evaluation.metrics import (
    avg_at_k,
    correct_matrix,
    maj_at_k,
    majority_answer,
    mean_pass_at_k,
    mean_test_fraction,
    pass_at_k,
)


def test_pass_at_k_hand_value():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n=4, c=1, k=1: 1 - C(3,1)/C(4,1) = 1 - 3/4 = 0.25 (pass@1 = c/n)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)


def test_pass_at_k_edges():
    assert pass_at_k(5, 0, 3) == 0.0  # no correct sample
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k = 3: every 3-subset holds a correct one
    assert pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 4) == 1.0  # k = n: pass@n is "any correct"
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_pass_at_k_matches_subset_enumeration(n):
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(combinations(range(n), k))
            brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    # C(1024, 512) overflows a float; the product form does not form it.
    value = pass_at_k(1024, 3, 512)
    assert value == pytest.approx(1 - comb(1021, 512) / comb(1024, 512), rel=1e-9)


def test_mean_pass_at_k_and_avg_at_k():
    correct = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)  # c = 1, 2, 0
    # avg@4 = 3 correct / 12 samples
    assert avg_at_k(correct) == pytest.approx(0.25)
    # pass@1 = mean(c / n) = (1/4 + 2/4 + 0) / 3 = 0.25 = avg@4
    assert mean_pass_at_k(correct.sum(1), n=4, k=1) == pytest.approx(0.25)
    # pass@2: 1 - C(3,2)/C(4,2) = 0.5; 1 - C(2,2)/C(4,2) = 5/6; 0 -> mean 4/9
    assert mean_pass_at_k([1, 2, 0], n=4, k=2) == pytest.approx((0.5 + 5 / 6) / 3)
    # pass@4 = share of problems with any correct sample
    assert mean_pass_at_k([1, 2, 0], n=4, k=4) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        avg_at_k(torch.zeros(3))


def test_correct_matrix_treats_unscorable_as_not_correct():
    assert correct_matrix([[1.0, None], [0.0, 1.0]]).tolist() == [[True, False], [False, True]]


def test_majority_answer_ties_and_none():
    assert majority_answer(["3", "4", "4", "3"]) == 0  # 2-2 tie: "3" occurs first
    assert majority_answer([None, "4", "3", "4"]) == 1
    assert majority_answer([None, None, "5"]) == 2  # None never votes
    assert majority_answer([None, None]) is None


def test_maj_at_k_hand_cases():
    answers = [
        ["3", "4", "4", "3"],  # tie -> "3" (first); its sample 0 is correct
        [None, None, None, "7"],  # one vote for "7", wrong
        ["5", "5", "6", None],  # "5" wins, correct
        [None, None, None, None],  # no answer -> wrong
    ]
    correct = [
        [True, False, False, True],
        [False, False, False, False],
        [True, True, False, False],
        [False, False, False, False],
    ]
    assert maj_at_k(answers, correct) == pytest.approx(2 / 4)


def test_maj_at_k_shape_errors():
    with pytest.raises(ValueError, match="same"):
        maj_at_k([["1"]], [])
    with pytest.raises(ValueError, match="problem 0"):
        maj_at_k([["1", "2"]], [[True]])


@pytest.mark.parametrize(
    "texts, expected",
    [
        (["#### 1/2", "#### 0.5", "\\boxed{\\frac{2}{4}}", "the answer is \\boxed{50\\%}"], "1/2"),
        (["#### 72", "#### 72.0", "so \\boxed{72}"], "72"),
        (["\\boxed{x+1}", "\\boxed{1+x}"], "x + 1"),
    ],
)
def test_equivalent_answers_share_a_canonical_string(texts, expected):
    assert [extract_answer(t) for t in texts] == [expected] * len(texts)


def test_equivalent_answers_vote_together():
    # "1/2" and "0.5" vote together (2 votes) and beat "3" (1 vote) though "3" comes first.
    answers = [extract_answer(t) for t in ["#### 3", "#### 1/2", "#### 0.5"]]
    assert majority_answer(answers) == 1
    assert maj_at_k([answers], [[False, True, True]]) == 1.0


def test_answers_sympy_does_not_equate_stay_apart():
    # Documented limit: no simplify(), so a factored and an expanded polynomial vote apart.
    assert extract_answer("\\boxed{(x+1)^2}") != extract_answer("\\boxed{x^2+2x+1}")


def test_no_answer_is_none():
    assert extract_answer("I do not know") is None
    assert extract_answer("") is None
    # The #### line is read first, as math_score reads it.
    assert extract_answer("12 apples\n#### 7\nmore text 9") == "7"


def test_mean_test_fraction_by_hand():
    # (1 + 1/3 + 0.5 + 0) / 4, the unscorable sample counting as no test passed
    assert mean_test_fraction([[1.0, 1 / 3], [0.5, None]]) == pytest.approx((1 + 1 / 3 + 0.5) / 4)
    with pytest.raises(ValueError, match="at least one sample"):
        mean_test_fraction([[]])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        mean_test_fraction([[1.5]])
