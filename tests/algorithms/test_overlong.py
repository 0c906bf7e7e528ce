"""DAPO's soft overlong punishment (algorithms/overlong.py), by hand."""
import pytest
import torch

from ibpo_lit.algorithms.overlong import soft_overlong_penalty


def test_the_ramp_by_hand():
    # L_max 100, buffer 20: free up to 80, then -1/20 per token, -1 at 100 and beyond
    lengths = torch.tensor([10, 80, 81, 90, 100, 130])
    got = soft_overlong_penalty(lengths, max_length=100, buffer=20)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.05, -0.5, -1.0, -1.0])
    assert soft_overlong_penalty(lengths, 100, 20, factor=0.5)[3].item() == pytest.approx(-0.25)


def test_bad_settings():
    with pytest.raises(ValueError, match="buffer"):
        soft_overlong_penalty(torch.tensor([1]), max_length=10, buffer=11)
    with pytest.raises(ValueError, match="factor"):
        soft_overlong_penalty(torch.tensor([1]), max_length=10, buffer=5, factor=-1)
