import pytest
import torch

from ibpo_lit.algorithms import (
    adaptive_alpha,
    is_full_rewrite,
    kept_positions,
    normalized_edit_distance,
)


def test_normalized_edit_distance():
    # [1,2,3,4] -> [1,5,3]: substitute 2->5, delete 4: 2 edits / max(4,3) = 0.5
    assert normalized_edit_distance([1, 2, 3, 4], [1, 5, 3]) == 0.5
    assert normalized_edit_distance([], []) == 0.0
    assert normalized_edit_distance([], [1, 2]) == 1.0
    assert normalized_edit_distance([9, 8], [9, 8]) == 0.0
    # large token ids (beyond any character range) and tensors work the same
    assert normalized_edit_distance(torch.tensor([150000, 2]), [150000, 3]) == 0.5


def test_kept_positions():
    # alignment: 1 equal, 2->5 replace, 3 equal, 4 deleted
    assert kept_positions([1, 2, 3, 4], [1, 5, 3]) == [True, False, True, False]
    assert kept_positions(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 5, 3])) == [True, False, True, False]
    assert kept_positions([1, 2], [7, 1, 2, 9]) == [True, True]  # insertions keep everything
    assert kept_positions([], [1]) == []
    assert kept_positions([4, 5], []) == [False, False]


def test_is_full_rewrite():
    original, corrected = [1, 2, 3, 4], [5, 6, 7, 4]  # d = 3/4 = .75
    near_ref, far_ref = [5, 6, 7, 8], [9, 9, 9, 9]  # d(corrected, .) = .25 and 1.0
    assert is_full_rewrite(original, corrected, near_ref, alpha=0.6)  # .75 > .6 and .75 > .25
    assert not is_full_rewrite(original, corrected, near_ref, alpha=0.8)  # .75 <= .8
    assert not is_full_rewrite(original, corrected, far_ref, alpha=0.6)  # .75 <= 1.0
    assert not is_full_rewrite(original, corrected, near_ref, alpha=0.75)  # strict >


def test_adaptive_alpha():
    # mean .3, population std .1 -> .3 + 2 * .1 = .5
    assert adaptive_alpha([0.2, 0.4]) == pytest.approx(0.5)
    assert adaptive_alpha([0.5]) == 0.5
    assert adaptive_alpha([]) == 1.0
