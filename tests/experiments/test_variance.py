"""The fixed-policy variance statistics (ibpo_lit/experiments/variance.py) where the answer is known."""
import pytest
import torch

from ibpo_lit.experiments.variance import (
    batch_gradients,
    bootstrap_ratio,
    bootstrap_snr,
    bootstrap_snr_difference,
    bootstrap_trace,
    cosine_to_mean,
    cross_grams,
    gram_trace,
    own_grams,
    prompt_grams,
    prompt_traces,
    resampled_snr,
    signal_to_noise,
    summarize,
    trace_cov,
)


def _iid_parts(batches, prompts, dims=6, seed=0):
    # Every prompt's part is 1/P of an i.i.d. draw (a mean over prompts): Cov = Sigma / P.
    g = torch.Generator().manual_seed(seed)
    mu = torch.linspace(-1, 1, dims, dtype=torch.float64)
    scale = torch.linspace(0.5, 2.0, dims, dtype=torch.float64)  # Sigma = diag(scale^2), trace 10.95
    x = mu + scale * torch.randn(batches, prompts, dims, generator=g, dtype=torch.float64)
    return x / prompts, float((scale ** 2).sum())


def test_trace_falls_as_one_over_rows_for_iid_rows():
    small, trace_sigma = _iid_parts(4000, 4)
    large, _ = _iid_parts(4000, 16, seed=1)
    assert trace_cov(batch_gradients(small)) == pytest.approx(trace_sigma / 4, rel=0.05)
    assert trace_cov(batch_gradients(large)) == pytest.approx(trace_sigma / 16, rel=0.05)
    # at equal rows the two estimators are the same estimator
    s = summarize(small[:400], rows_per_batch=4, flops_per_batch=1.0, n_resamples=200)
    assert s["trace_cov_x_rows"] == pytest.approx(trace_cov(batch_gradients(large[:400])) * 16, rel=0.2)
    assert s["trace_cov_ci"][0] < trace_sigma / 4 < s["trace_cov_ci"][1]


def test_cosine_is_to_the_other_batches_mean():
    grads = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # batch 0 against the mean of batches 1 and 2: (0.5, 1) -> cos = 0.5 / (1 * sqrt(1.25))
    assert cosine_to_mean(grads)[0].item() == pytest.approx(0.5 / 1.25 ** 0.5)
    assert trace_cov(torch.ones(5, 3)) == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        trace_cov(torch.ones(1, 3))


def test_bootstrap_resamples_prompts_as_well_as_seeds():
    parts, trace_sigma = _iid_parts(60, 8)
    # independent prompts: the batch trace is the sum of the prompts' own traces
    assert float(prompt_traces(parts).sum()) == pytest.approx(trace_cov(batch_gradients(parts)), rel=0.25)
    lo, hi = bootstrap_trace(parts, n_resamples=300, seed=0)
    assert lo < trace_sigma / 8 < hi
    # one prompt carries all the spread: resampling prompts must widen the interval
    spread = parts.clone()
    spread[:, 1:] = spread[:, 1:].mean(dim=0, keepdim=True)
    lo2, hi2 = bootstrap_trace(spread, n_resamples=300, seed=0)
    assert lo2 == pytest.approx(0.0, abs=1e-12)  # resamples without prompt 0 have no spread at all
    assert hi2 > lo2


def test_the_cosine_interval_holds_the_estimate():
    from ibpo_lit.experiments.variance import bootstrap_cosine

    parts, _ = _iid_parts(20, 4, seed=3)
    point = float(cosine_to_mean(batch_gradients(parts)).mean())
    lo, hi = bootstrap_cosine(parts, n_resamples=400, seed=0)
    assert lo < point < hi


def test_the_gram_matrices_give_the_same_trace_as_the_vectors():
    parts, _ = _iid_parts(7, 3, seed=4)
    grams = prompt_grams(parts)
    assert grams.shape == (3, 7, 7)
    for p in range(3):
        assert float(gram_trace(grams[p])) == pytest.approx(trace_cov(parts[:, p]), rel=1e-10)


def test_the_ratio_interval_is_paired_by_prompt():
    # Prompts of very different difficulty (gradient scales 0.1 to 30): each method's own
    # interval spans that spread, the paired ratio cancels it. Method a is method b at half the
    # scale: its trace is 1/4 of b's on every prompt.
    g = torch.Generator().manual_seed(5)
    scales = torch.tensor([0.1, 1.0, 3.0, 30.0], dtype=torch.float64)[None, :, None]
    b = scales * torch.randn(16, 4, 6, generator=g, dtype=torch.float64)
    a = 0.5 * scales * torch.randn(16, 4, 6, generator=g, dtype=torch.float64)
    lo, hi = bootstrap_ratio(prompt_grams(a), prompt_grams(b), n_resamples=400, seed=0)
    assert lo < 0.25 < hi
    assert hi < 1.0  # the claim "a has lower variance" is resolved
    a_lo, a_hi = bootstrap_trace(a, n_resamples=400, seed=0)
    b_lo, b_hi = bootstrap_trace(b, n_resamples=400, seed=0)
    assert a_hi > b_lo  # unpaired, the two methods' intervals overlap: the pairing is what resolves it
    with pytest.raises(ValueError, match="prompts"):
        bootstrap_ratio(prompt_grams(a), prompt_grams(b[:, :3]))


def test_the_ratio_interval_is_paired_by_batch_when_methods_share_rollouts():
    # As at a trained checkpoint: most batches give a prompt no gradient (its group came out all
    # right or all wrong), a few give a large one. Two methods on the same rollouts share that
    # luck; a shapes the same groups at half the scale (trace 1/4 of b's), plus its own small noise.
    g = torch.Generator().manual_seed(7)
    lucky = (torch.rand(12, 4, 1, generator=g) < 0.25).double()
    b = lucky * 10 * torch.randn(12, 4, 6, generator=g, dtype=torch.float64)
    a = 0.5 * b + 0.05 * torch.randn(12, 4, 6, generator=g, dtype=torch.float64)
    lo, hi = bootstrap_ratio(prompt_grams(a), prompt_grams(b), n_resamples=400, seed=0)
    assert lo < 0.25 < hi and hi < 0.4  # the shared luck cancels: resolved, and near 1/4
    u_lo, u_hi = bootstrap_ratio(prompt_grams(a), prompt_grams(b), n_resamples=400, seed=0, paired_batches=False)
    assert u_hi - u_lo > 10 * (hi - lo)  # drawn apart, which batches were lucky dominates the ratio
    assert bootstrap_ratio(prompt_grams(b), prompt_grams(b), n_resamples=50) == pytest.approx((1.0, 1.0))
    with pytest.raises(ValueError, match="as many batches"):
        bootstrap_ratio(prompt_grams(a), prompt_grams(b[:6]))


def test_signal_to_noise_does_not_change_with_the_gradients_scale():
    parts, trace_sigma = _iid_parts(3000, 4, seed=6)
    mu_sq = float((torch.linspace(-1, 1, 6, dtype=torch.float64) ** 2).sum())
    expected = mu_sq / (trace_sigma / 4)  # the batch gradient is a mean of 4 i.i.d. draws
    for scale in (1.0, 0.1):  # a loss divided by 10x the rows: mean and noise shrink together
        s = summarize(scale * parts[:400], rows_per_batch=4, flops_per_batch=1.0, n_resamples=10)
        snr = signal_to_noise(s["mean_grad_sq_norm"], s["trace_cov"], s["batches"])
        assert snr == pytest.approx(expected, rel=0.2)
    # few batches: the |mean|^2 bias (trace / M) is taken off, so the estimate stays unbiased
    grads = batch_gradients(parts)
    few = [signal_to_noise(float((grads[i:i + 4].mean(dim=0) ** 2).sum()), trace_sigma / 4, 4)
           for i in range(0, 3000, 4)]
    assert sum(few) / len(few) == pytest.approx(expected, rel=0.1)
    biased = [float((grads[i:i + 4].mean(dim=0) ** 2).sum()) / (trace_sigma / 4) for i in range(0, 3000, 4)]
    assert sum(biased) / len(biased) > 1.1 * expected  # without the correction it would not be


MU_SQ = 2.8  # |linspace(-1, 1, 6)|^2 = 2 * (1 + 0.36 + 0.04), the mean of _iid_parts' draws


def test_the_snr_from_cross_grams_is_the_batch_snr():
    parts, trace_sigma = _iid_parts(60, 4)
    cross = cross_grams(parts)
    assert cross.shape == (4, 4, 60, 60)
    assert torch.allclose(own_grams(cross), prompt_grams(parts))
    # every prompt once, every batch: |mean|^2 of the batch gradients over the prompts' own traces
    mean_sq = float((batch_gradients(parts).mean(dim=0) ** 2).sum())
    expected = signal_to_noise(mean_sq, float(prompt_traces(parts).sum()), 60)
    assert resampled_snr(cross) == pytest.approx(expected, rel=1e-10)
    # the batch gradient is a mean of 4 i.i.d. draws: |mu|^2 / (tr Sigma / 4) = 1.02; its interval holds it
    lo, hi = bootstrap_snr(cross, n_resamples=300, seed=0)
    assert lo < MU_SQ / (trace_sigma / 4) < hi
    assert bootstrap_snr(0.01 * cross, n_resamples=300, seed=0) == pytest.approx((lo, hi))  # scale-free


def test_two_copies_of_a_prompt_carry_twice_its_signal_to_noise():
    # A resample that draws prompt 0 twice counts it as two instances: signal |2 m|^2 - 4 v / M,
    # noise 2 v, so twice one instance's (|m|^2 - v / M) / v. Without the copies' shared bias
    # (each copy's noise is the other's) the signal would be |2 m|^2 - 2 v / M.
    parts, _ = _iid_parts(5, 3, seed=8)
    cross = cross_grams(parts)
    rows = torch.arange(5)
    one = resampled_snr(cross, rows, torch.tensor([0]))
    assert resampled_snr(cross, rows, torch.tensor([0, 0])) == pytest.approx(2 * one, rel=1e-10)
    assert resampled_snr(cross, rows, torch.tensor([0, 0, 0])) == pytest.approx(3 * one, rel=1e-10)


def test_the_snr_difference_is_paired_by_prompt_and_batch():
    # Prompts of very different scales; method a is method b on the same rollouts with half the
    # mean gradient (same noise): its signal-to-noise is 1/4 of b's, 0.149 against 0.596
    # (|sum_p s_p mu|^2 / (sum_p s_p^2 tr I) = 34.1^2 * 2.8 / (910.01 * 6)).
    g = torch.Generator().manual_seed(0)
    scales = torch.tensor([0.1, 1.0, 3.0, 30.0], dtype=torch.float64)[None, :, None]
    mu = torch.linspace(-1, 1, 6, dtype=torch.float64)
    b = scales * (mu + torch.randn(24, 4, 6, generator=g, dtype=torch.float64))
    a = b - 0.5 * scales * mu
    lo, hi = bootstrap_snr_difference(cross_grams(a), cross_grams(b), n_resamples=400, seed=0)
    assert lo < 0.149 - 0.596 < hi < 0  # resolved: a has less signal for its noise
    a_lo, a_hi = bootstrap_snr(cross_grams(a), n_resamples=400, seed=0)
    b_lo, b_hi = bootstrap_snr(cross_grams(b), n_resamples=400, seed=0)
    assert a_hi > b_lo  # each method's own interval overlaps the other's: the pairing resolves it
    # a rescaled gradient (a loss dividing by more rows) has the same signal-to-noise on every resample
    assert bootstrap_snr_difference(cross_grams(0.5 * b), cross_grams(b), n_resamples=50) == pytest.approx((0.0, 0.0))
    with pytest.raises(ValueError, match="as many batches"):
        bootstrap_snr_difference(cross_grams(a), cross_grams(b[:6]))
