"""Inverse-CDF sampling: right distribution, never a filtered token, per-row generators."""
import math

import torch

from ibpo_lit.rollout.hf import _sample_rows


def test_frequencies_match_the_softmax():
    scores = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2), -math.inf]])
    gen = [torch.Generator().manual_seed(0)]
    counts = torch.zeros(4)
    for _ in range(20000):
        counts[_sample_rows(scores, gen, torch.device("cpu"))[0]] += 1
    freq = counts / counts.sum()
    # binomial std at n=20000, p=.5 is 0.0035: 4 std is 0.014
    assert torch.allclose(freq[:3], torch.tensor([0.5, 0.3, 0.2]), atol=0.014)
    assert counts[3] == 0  # filtered (-inf) token


def test_zero_mass_tokens_between_kept_ones_are_never_drawn():
    scores = torch.tensor([[-math.inf, 0.0, -math.inf, -math.inf, 0.0, -math.inf]])
    gen = [torch.Generator().manual_seed(1)]
    drawn = {int(_sample_rows(scores, gen, torch.device("cpu"))[0]) for _ in range(2000)}
    assert drawn == {1, 4}


def test_each_row_depends_only_on_its_own_generator():
    scores = torch.randn(3, 50)
    a = _sample_rows(scores, [torch.Generator().manual_seed(s) for s in (1, 2, 3)], torch.device("cpu"))
    b = _sample_rows(scores[1:2], [torch.Generator().manual_seed(2)], torch.device("cpu"))
    assert a[1] == b[0]
