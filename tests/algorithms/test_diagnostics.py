"""Hand-derived values for the diagnostics of METHOD section 6."""
from __future__ import annotations

import math

import pytest
import torch

from ibpo_lit.algorithms.diagnostics import estimate_flops, gradient_variance, reward_shaping_covariance


def test_covariance_by_hand():
    # Y = 2r - 1 = [1, -1, -1, 1], mean 0; phi = [0, .5, 0, 0], mean .125
    # cov = mean(Y * (phi - .125)) = (1*-.125 + -1*.375 + -1*-.125 + 1*-.125) / 4 = -.5 / 4 = -.125
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    delta = torch.tensor([0.0, 0.5, 0.0, 0.0])
    assert reward_shaping_covariance(rewards, delta) == pytest.approx(-0.125)


def test_covariance_drops_unscorable_rows():
    # The NaN row goes; rows [1, 0, 0] with phi [0, .3, 0]: Y = [1, -1, -1], mean -1/3;
    # phi mean .1; cov = (4/3*-.1 + -2/3*.2 + -2/3*-.1) / 3 = (-.4/3 - .4/3 + .2/3) / 3 = -.2/3
    rewards = torch.tensor([1.0, 0.0, math.nan, 0.0])
    delta = torch.tensor([0.0, 0.3, 0.9, 0.0])
    assert reward_shaping_covariance(rewards, delta) == pytest.approx(-0.2 / 3)


def test_covariance_edge_cases():
    assert reward_shaping_covariance(torch.tensor([1.0, 0.0]), torch.zeros(2)) == 0.0  # no shaping
    assert math.isnan(reward_shaping_covariance(torch.tensor([math.nan]), torch.zeros(1)))
    with pytest.raises(ValueError):
        reward_shaping_covariance(torch.zeros(3), torch.zeros(2))


def test_gradient_variance_by_hand():
    # splits g = [[1, 2], [3, 2], [5, 8]]
    # column 0: mean 3, deviations -2, 0, 2 -> unbiased var (4 + 0 + 4) / 2 = 4
    # column 1: mean 4, deviations -2, -2, 4 -> unbiased var (4 + 4 + 16) / 2 = 12
    # trace 16; mean [3, 4] -> ||mean||^2 = 25; relative 16 / 25 = .64
    out = gradient_variance(torch.tensor([[1.0, 2.0], [3.0, 2.0], [5.0, 8.0]]))
    assert out["trace"] == pytest.approx(16.0)
    assert out["mean_sq_norm"] == pytest.approx(25.0)
    assert out["relative"] == pytest.approx(0.64)


def test_gradient_variance_zero_mean_and_bad_shapes():
    out = gradient_variance(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))
    # mean 0 -> relative undefined; var per column (1 + 1) / 1 = 2 -> trace 4
    assert out["trace"] == pytest.approx(4.0) and out["mean_sq_norm"] == 0.0 and math.isnan(out["relative"])
    with pytest.raises(ValueError):
        gradient_variance(torch.ones(1, 3))
    with pytest.raises(ValueError):
        gradient_variance(torch.ones(3))


def test_flops_by_hand():
    # N = 1000: generation 2N * (30 + 70) = 200_000; training 6N * 120 = 720_000;
    # no-grad 2N * 50 = 100_000; total 1_020_000
    out = estimate_flops(1000, prompt_tokens=30, generated_tokens=70, trained_tokens=120, no_grad_tokens=50)
    assert out == {"generation": 200_000.0, "training": 720_000.0, "no_grad": 100_000.0, "total": 1_020_000.0}
    assert estimate_flops(10, 0, 0, 0)["total"] == 0.0
    with pytest.raises(ValueError):
        estimate_flops(10, -1, 0, 0)
