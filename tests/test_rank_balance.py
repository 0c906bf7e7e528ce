"""Rows dealt to ranks by length (``training/rank_balance.py``, ``rollout.balance_ranks``): the
deal, hand-derived; which rows travel together. Two processes (the loss and gradient unchanged,
fewer lockstep passes): tests/scale/test_micro_batch_ranks.py."""
import pytest
import torch

from ibpo_lit.config import RolloutConfig
from ibpo_lit.training.rank_balance import balanced_rows, deal, units_of


def test_the_deal_is_longest_first_in_snake_order():
    # sorted: 6 (unit 5), 5 (0), 4 (2), 3 (4), 2 (3), 1 (1); snake 0 1 | 1 0 | 0 1
    assert deal([5, 1, 4, 2, 3, 6], 2) == [[3, 4, 5], [0, 1, 2]]  # totals 11 and 10
    # three ranks, seven units: 0 1 2 | 2 1 0 | 0
    assert deal([7, 6, 5, 4, 3, 2, 1], 3) == [[0, 5, 6], [1, 4], [2, 3]]
    # ties: the lower index first (snake 0 1 | 1); fewer units than ranks leaves a rank empty
    assert deal([2, 2, 2], 2) == [[0], [1, 2]]
    assert deal([1], 3) == [[0], [], []]
    assert deal([], 2) == [[], []]
    with pytest.raises(ValueError, match="parts"):
        deal([1], 0)


def test_each_micro_batch_index_holds_rows_of_about_one_length():
    # rank 0 made the long rows, rank 1 the short ones: dealt, the k-th shortest row of each rank
    # differs by one token at most
    lengths = [20, 21, 22, 23, 2, 3, 4, 5]
    parts = deal(lengths, 2)
    mine = [sorted(lengths[i] for i in part) for part in parts]
    # sorted 23 (3), 22 (2), 21 (1), 20 (0), 5 (7), 4 (6), 3 (5), 2 (4); snake 0 1 | 1 0 | 0 1 | 1 0
    assert parts == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert mine == [[2, 5, 20, 23], [3, 4, 21, 22]]
    assert sum(mine[0]) == sum(mine[1]) == 50


def test_units_keep_a_prompts_rows_together_unless_packed():
    source = torch.tensor([0, 0, 0, 1, 1, 1])
    group = torch.tensor([0, 0, 1, 0, 0, 1])  # group 0 of rank 0 is not group 0 of rank 1
    rows = torch.tensor([5, 0, 3, 1, 4])
    assert units_of(rows, source, group, by_row=False).tolist() == [0, 1, 2, 1, 2]
    assert units_of(rows, source, group, by_row=True).tolist() == [0, 1, 2, 3, 4]


def test_balanced_rows_deal_units_by_their_summed_length():
    lengths = torch.tensor([10, 1, 1, 6, 6, 1])
    rows = torch.tensor([0, 1, 2, 3, 4, 5])
    units = torch.tensor([0, 1, 1, 2, 3, 1])  # unit costs 10, 3, 6, 6
    # sorted 10 (0), 6 (2), 6 (3), 3 (1): rank 0 gets units 0 and 1, rank 1 units 2 and 3
    out = balanced_rows(rows, lengths, units, 2)
    assert [o.tolist() for o in out] == [[0, 1, 2, 5], [3, 4]]
    # row by row: sorted 10 (0), 6 (3), 6 (4), 1 (1), 1 (2), 1 (5); snake 0 1 | 1 0 | 0 1
    by_row = balanced_rows(rows, lengths, torch.arange(6), 2)
    assert [o.tolist() for o in by_row] == [[0, 1, 2], [3, 4, 5]]
    assert balanced_rows(torch.zeros(0, dtype=torch.long), lengths, torch.zeros(0, dtype=torch.long), 2)[0].numel() == 0


def test_the_setting_is_off_by_default():
    assert RolloutConfig().balance_ranks is False
