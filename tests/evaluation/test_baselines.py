"""Baselines' pure parts: names, reference candidates and choice, correction arithmetic."""
import random

import pytest
import torch

from ibpo_lit.evaluation.baselines import (
    BASELINES,
    choose_references,
    consensus_candidates,
    correction_metrics,
    oracle_candidates,
    parse_baselines,
    reference_table,
)
from ibpo_lit.training.seeding import REFERENCE_CHOICE, rollout_seeds


# ------------------------------------------------------------------ names
def test_parse_baselines_accepts_lists_and_comma_strings():
    assert parse_baselines(None, k=4) == ()
    assert parse_baselines((), k=4) == ()
    assert parse_baselines(["best_of_n"], k=1) == ("best_of_n",)  # Best-of-N needs no second sample
    assert parse_baselines("test_time_correction, best_of_n,test_time_correction", k=2) == (
        "test_time_correction", "best_of_n")
    assert parse_baselines(list(BASELINES), k=2) == BASELINES


def test_parse_baselines_errors():
    with pytest.raises(ValueError, match=r"unknown baseline\(s\) \['self_consistency'\]; valid names: "
                                         r"\['test_time_correction', 'test_time_correction_oracle', 'best_of_n'\]"):
        parse_baselines("best_of_n,self_consistency", k=4)
    for name in ("test_time_correction", "test_time_correction_oracle"):
        with pytest.raises(ValueError, match="needs k >= 2"):
            parse_baselines([name], k=1)


# ------------------------------------------------------------------ reference candidates
def test_consensus_candidates_by_hand():
    answers = ["5", "5", "7"]  # "5" is the consensus (2 of 3)
    assert consensus_candidates(answers, 2) == [0, 1]  # the dissenter is shown a consensus sample
    assert consensus_candidates(answers, 0) == [1]  # a consensus sample is shown its agreeing partner
    # a tie between two answers held by two samples each: both count as consensus
    assert consensus_candidates(["a", "a", "b", "b", "c"], 4) == [0, 1, 2, 3]
    assert consensus_candidates(["a", "a", "b", "b", "c"], 0) == [1, 2, 3]
    # no two samples agree (or nothing was extracted, as for code): any other sample
    assert consensus_candidates(["1", "2", "3"], 1) == [0, 2]
    assert consensus_candidates([None, None, "x"], 0) == [1, 2]
    assert consensus_candidates([None, None], 1) == [0]


def test_oracle_candidates_by_hand():
    assert oracle_candidates([True, False, True], 1) == [0, 2]
    assert oracle_candidates([True, False, True], 0) == [2]  # a correct sample gets the other correct one
    assert oracle_candidates([False, False, True], 2) == [0, 1]  # no other correct: any other (METHOD 5.1)
    assert oracle_candidates([False, False, False], 0) == [1, 2]


def test_choose_references_is_a_seeded_uniform_pick():
    candidates = [[1, 2, 3], [0], [0, 1]]
    seeds = [11, 12, 13]
    expected = [random.Random(11).choice([1, 2, 3]), 0, random.Random(13).choice([0, 1])]
    assert choose_references(candidates, seeds) == expected
    # uniform: over many seeds each of three candidates is drawn about a third of the time
    picks = [choose_references([[1, 2, 3]], [s])[0] for s in range(3000)]
    assert all(900 < picks.count(c) < 1100 for c in (1, 2, 3))
    with pytest.raises(ValueError, match="2 candidate lists but 1 seeds"):
        choose_references([[1], [0]], [5])
    with pytest.raises(ValueError, match="at least one candidate"):
        choose_references([[]], [5])


def test_reference_table_depends_only_on_seed_problem_and_sample():
    answers = [["5", "5", "7"], ["1", "2", "3"], [None, None, None]]
    correct = [[True, True, False], [False, False, True], [False, False, False]]
    refs = reference_table(0, answers, correct, oracle=False)
    # each pick is problem p's own generator: a shorter benchmark (limit) gets the same picks
    assert reference_table(0, answers[:2], correct[:2], oracle=False) == refs[:2]
    for p, (ans, row) in enumerate(zip(answers, refs)):
        seeds = rollout_seeds(0, p, REFERENCE_CHOICE, 3)
        assert row == [random.Random(seeds[j]).choice(consensus_candidates(ans, j)) for j in range(3)]
    assert refs[0][2] in (0, 1) and refs[0][0] == 1 and refs[0][1] == 0
    oracle = reference_table(0, answers, correct, oracle=True)
    assert oracle[0] == [1, 0, oracle[0][2]] and oracle[0][2] in (0, 1)
    assert oracle[1][0] == 2 and oracle[1][1] == 2  # the wrong samples are shown the correct one
    # another seed changes some picks (18 free picks over 20 seeds cannot all coincide)
    assert any(reference_table(s, answers, correct, oracle=False) != refs for s in range(1, 21))


# ------------------------------------------------------------------ arithmetic
def test_correction_metrics_by_hand():
    before = torch.tensor([[1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    after = torch.tensor([[1, 1, 0], [0, 1, 0]], dtype=torch.bool)
    # after: 3 of 6 correct. Wrong before: (0,1) (0,2) (1,2), of which (0,1) is fixed: 1/3.
    # Correct before: (0,0) (1,0) (1,1), of which (1,0) is broken: 1/3.
    assert correction_metrics(before, after) == {"@1": 0.5, "fixed": 1 / 3, "broken": 1 / 3}
    all_right = torch.ones(2, 2, dtype=torch.bool)
    assert correction_metrics(all_right, all_right) == {"@1": 1.0, "fixed": None, "broken": 0.0}
    all_wrong = torch.zeros(1, 4, dtype=torch.bool)
    assert correction_metrics(all_wrong, torch.tensor([[1, 0, 0, 0]])) == {"@1": 0.25, "fixed": 0.25, "broken": None}
    with pytest.raises(ValueError, match="one shape"):
        correction_metrics(before, after[:, :2])
