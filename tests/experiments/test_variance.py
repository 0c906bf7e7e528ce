"""The fixed-policy variance statistics (ibpo_lit/experiments/variance.py) where the answer is known."""
import math

import pytest
import torch

from ibpo_lit.experiments.variance import (
    batch_gradients,
    batch_gram,
    cosine_to_mean,
    cross_grams,
    gram_cosine,
    gram_snr,
    gram_trace,
    jackknife_interval,
    signal_to_noise,
    snr_difference,
    summarize,
    summarize_grams,
    trace_cov,
    trace_ratio,
)


def _iid_parts(batches, prompts, dims=6, seed=0):
    # Every prompt's part is 1/P of an i.i.d. draw (a mean over prompts): Cov = Sigma / P.
    g = torch.Generator().manual_seed(seed)
    mu = torch.linspace(-1, 1, dims, dtype=torch.float64)
    scale = torch.linspace(0.5, 2.0, dims, dtype=torch.float64)  # Sigma = diag(scale^2), trace 10.95
    x = mu + scale * torch.randn(batches, prompts, dims, generator=g, dtype=torch.float64)
    return x / prompts, float((scale ** 2).sum())


MU_SQ = 2.8  # |linspace(-1, 1, 6)|^2 = 2 * (1 + 0.36 + 0.04), the mean of _iid_parts' draws


def test_trace_falls_as_one_over_rows_for_iid_rows():
    small, trace_sigma = _iid_parts(4000, 4)
    large, _ = _iid_parts(4000, 16, seed=1)
    assert trace_cov(batch_gradients(small)) == pytest.approx(trace_sigma / 4, rel=0.05)
    assert trace_cov(batch_gradients(large)) == pytest.approx(trace_sigma / 16, rel=0.05)
    # at equal rows the two estimators are the same estimator
    s = summarize(small[:64], rows_per_batch=4, flops_per_batch=1.0)
    assert s["trace_cov_x_rows"] == pytest.approx(trace_cov(batch_gradients(large[:64])) * 16, rel=0.3)
    assert s["trace_cov_ci"][0] < trace_sigma / 4 < s["trace_cov_ci"][1]


def test_the_batch_gram_is_the_batch_gradients_gram():
    parts, _ = _iid_parts(7, 3, seed=4)
    cross = cross_grams(parts)
    assert cross.shape == (3, 3, 7, 7)
    grads = batch_gradients(parts)
    assert torch.allclose(batch_gram(cross), grads @ grads.T)
    assert torch.allclose(batch_gram(cross, [0, 1, 2]), batch_gram(cross))
    # the point estimates are the vectors' own, cross-prompt terms included
    assert gram_trace(batch_gram(cross)) == pytest.approx(trace_cov(grads), rel=1e-12)
    assert gram_cosine(batch_gram(cross)) == pytest.approx(float(cosine_to_mean(grads).mean()), rel=1e-12)
    mean_sq = float((grads.mean(dim=0) ** 2).sum())
    assert gram_snr(batch_gram(cross)) == pytest.approx(signal_to_noise(mean_sq, trace_cov(grads), 7), rel=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        gram_trace(batch_gram(cross)[:1, :1])


def test_a_subset_of_prompts_is_rescaled_to_a_batch_of_all_of_them():
    # Four copies of one prompt's parts: any subset of s prompts, rescaled, is the full batch
    # (own blocks x 4 / s, cross blocks x 12 / (s (s - 1)) turn s copies into 4).
    one, _ = _iid_parts(5, 1, seed=2)
    cross = cross_grams(one.expand(5, 4, 6))
    full = batch_gram(cross)
    assert torch.allclose(batch_gram(cross, [1, 3]), full)
    assert torch.allclose(batch_gram(cross, [2]), 4 * cross[0, 0])  # one prompt: its own block, x 4


def test_cosine_is_to_the_other_batches_mean():
    grads = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # batch 0 against the mean of batches 1 and 2: (0.5, 1) -> cos = 0.5 / (1 * sqrt(1.25))
    assert cosine_to_mean(grads)[0].item() == pytest.approx(0.5 / 1.25 ** 0.5)
    assert trace_cov(torch.ones(5, 3)) == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        trace_cov(torch.ones(1, 3))


def test_the_jackknife_interval_by_hand_for_a_linear_statistic():
    # The mean of the M diagonal entries of a batch Gram, batches only: leaving batch i out gives
    # the mean of the other M - 1, whose jackknife variance is exactly s^2 / M (the t-interval of
    # the M numbers). Numbers 1, 2, 3, 4: mean 2.5, s^2 = 5/3, half width t_{3, 0.975} sqrt(5/12).
    cross = torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))[None, None]
    point, low, high = jackknife_interval(lambda g: float(g.diagonal().mean()), [cross], prompts=False)
    half = 3.182446305284263 * math.sqrt(5 / 12)
    assert (point, low, high) == pytest.approx((2.5, 2.5 - half, 2.5 + half))


def test_jackknife_signal_to_noise_covers_the_known_answer():
    # i.i.d. parts: the batch gradient is a mean of 4 draws with mean mu and covariance Sigma / 4,
    # so the signal-to-noise is |mu|^2 / (tr Sigma / 4) = 2.8 / 2.7375 = 1.02. On one large sample
    # the estimate is there; over 120 small experiments (8 batches x 4 prompts, as the measured
    # runs) the 95% intervals hold it at least 90% of the time. (The percentile bootstrap these
    # replace leaned upward: a resample that draws a batch twice has less noise.)
    big, trace_sigma = _iid_parts(3000, 4, seed=6)
    truth = MU_SQ / (trace_sigma / 4)
    assert gram_snr(batch_gram(cross_grams(big))) == pytest.approx(truth, rel=0.1)
    covered = {"snr": 0, "trace": 0}
    for trial in range(120):
        parts, _ = _iid_parts(8, 4, seed=100 + trial)
        cross = cross_grams(parts)
        _, low, high = jackknife_interval(gram_snr, [cross])
        covered["snr"] += low <= truth <= high
        _, low, high = jackknife_interval(gram_trace, [cross], log=True)
        covered["trace"] += low <= trace_sigma / 4 <= high
    assert covered["snr"] >= 108 and covered["trace"] >= 108


def test_prompts_that_differ_widen_the_interval():
    # One prompt carries all the spread: leaving it out leaves no variance at all, so the prompt
    # jackknife sees how much the trace depends on which prompts were drawn.
    parts, _ = _iid_parts(16, 8, seed=3)
    spread = parts.clone()
    spread[:, 1:] = spread[:, 1:].mean(dim=0, keepdim=True)
    cross = cross_grams(spread)
    _, lo_b, hi_b = jackknife_interval(gram_trace, [cross], prompts=False, log=True)
    _, lo, hi = jackknife_interval(gram_trace, [cross], log=True)
    # (leaving prompt 0 out gives a trace of 0: no log scale then, and a lower bound below 0)
    assert hi - lo > 3 * (hi_b - lo_b)


def test_the_ratio_interval_is_paired_by_prompt():
    # Prompts of very different difficulty (gradient scales 0.1 to 30): each method's own
    # interval spans that spread, the paired ratio cancels it. Method a is method b at half the
    # scale: its trace is 1/4 of b's on every prompt.
    g = torch.Generator().manual_seed(5)
    scales = torch.tensor([0.1, 1.0, 3.0, 30.0], dtype=torch.float64)[None, :, None]
    b = cross_grams(scales * torch.randn(16, 4, 6, generator=g, dtype=torch.float64))
    a = cross_grams(0.5 * scales * torch.randn(16, 4, 6, generator=g, dtype=torch.float64))
    _, lo, hi = jackknife_interval(trace_ratio, [a, b], log=True)
    assert lo < 0.25 < hi < 1.0  # resolved: a has lower variance
    _, a_lo, a_hi = jackknife_interval(gram_trace, [a], log=True)
    _, b_lo, b_hi = jackknife_interval(gram_trace, [b], log=True)
    assert a_hi > b_lo  # unpaired, the two methods' intervals overlap: the pairing is what resolves it
    assert jackknife_interval(trace_ratio, [b, b], log=True) == pytest.approx((1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="prompts"):
        jackknife_interval(trace_ratio, [a, b[:3, :3]])
    with pytest.raises(ValueError, match="as many batches"):
        jackknife_interval(trace_ratio, [a, b[..., :6, :6]])


def test_the_ratio_interval_is_paired_by_batch_when_methods_share_rollouts():
    # As at a trained checkpoint: most batches give a prompt no gradient (its group came out all
    # right or all wrong), a few give a large one. Two methods on the same rollouts share that
    # luck; a shapes the same groups at half the scale (trace 1/4 of b's), plus its own small noise.
    g = torch.Generator().manual_seed(7)
    lucky = (torch.rand(12, 4, 1, generator=g) < 0.25).double()
    b = lucky * 10 * torch.randn(12, 4, 6, generator=g, dtype=torch.float64)
    a = 0.5 * b + 0.05 * torch.randn(12, 4, 6, generator=g, dtype=torch.float64)
    _, lo, hi = jackknife_interval(trace_ratio, [cross_grams(a), cross_grams(b)], log=True)
    assert lo < 0.25 < hi < 0.3  # the shared luck cancels: resolved, and near 1/4


def test_signal_to_noise_does_not_change_with_the_gradients_scale():
    parts, trace_sigma = _iid_parts(3000, 4, seed=6)
    expected = MU_SQ / (trace_sigma / 4)  # the batch gradient is a mean of 4 i.i.d. draws
    for scale in (1.0, 0.1):  # a loss divided by 10x the rows: mean and noise shrink together
        s = summarize(scale * parts[:64], rows_per_batch=4, flops_per_batch=1.0)
        assert s["signal_to_noise"] == pytest.approx(expected, rel=0.3)
    small = cross_grams(parts[:8])
    assert jackknife_interval(gram_snr, [0.01 * small]) == pytest.approx(jackknife_interval(gram_snr, [small]))
    # few batches: the |mean|^2 bias (trace / M) is taken off, so the estimate stays unbiased
    grads = batch_gradients(parts)
    few = [signal_to_noise(float((grads[i:i + 4].mean(dim=0) ** 2).sum()), trace_sigma / 4, 4)
           for i in range(0, 3000, 4)]
    assert sum(few) / len(few) == pytest.approx(expected, rel=0.1)
    biased = [float((grads[i:i + 4].mean(dim=0) ** 2).sum()) / (trace_sigma / 4) for i in range(0, 3000, 4)]
    assert sum(biased) / len(biased) > 1.1 * expected  # without the correction it would not be


def test_the_snr_difference_is_paired_by_prompt_and_batch():
    # Prompts of different scales; method a is method b on the same rollouts with half the mean
    # gradient (same noise): its signal-to-noise is 1/4 of b's, 0.309 against 1.235
    # (|sum_p s_p mu|^2 / (sum_p s_p^2 tr I) = 7.5^2 * 2.8 / (21.25 * 6)).
    g = torch.Generator().manual_seed(0)
    scales = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64)[None, :, None]
    mu = torch.linspace(-1, 1, 6, dtype=torch.float64)
    b = scales * (mu + torch.randn(24, 4, 6, generator=g, dtype=torch.float64))
    a = b - 0.5 * scales * mu
    _, lo, hi = jackknife_interval(snr_difference, [cross_grams(a), cross_grams(b)])
    assert lo < 0.309 - 1.235 < hi < 0  # resolved: a has less signal for its noise
    _, a_lo, a_hi = jackknife_interval(gram_snr, [cross_grams(a)])
    _, b_lo, b_hi = jackknife_interval(gram_snr, [cross_grams(b)])
    assert a_hi > b_lo  # each method's own interval overlaps the other's: the pairing resolves it
    # a rescaled gradient (a loss dividing by more rows) has the same signal-to-noise on every leave-out
    assert jackknife_interval(snr_difference, [cross_grams(0.5 * b), cross_grams(b)])[1:] == pytest.approx((0.0, 0.0))


def test_summarize_grams_recomputes_what_summarize_saved():
    parts, _ = _iid_parts(8, 4, seed=9)
    saved = summarize(parts, rows_per_batch=32, flops_per_batch=2.0)
    again = summarize_grams(torch.tensor(saved["prompt_cross_grams"]), 32, 2.0)
    for key, value in again.items():
        assert saved[key] == (pytest.approx(value) if not isinstance(value, str) else value)
    # independent prompts: the cross-prompt covariances are noise around 0, a small share of the trace
    assert abs(saved["cross_prompt_share"]) < 0.5
    assert saved["trace_cov_x_flops_ci"] == pytest.approx([2 * v for v in saved["trace_cov_ci"]])
