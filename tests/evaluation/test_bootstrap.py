"""Intervals over seeds (t, paired t, Welch, log-t, percentile bootstrap) and combine_runs."""
import json
import math

import numpy as np
import pytest

from ibpo_lit.evaluation.bootstrap import (
    bootstrap_ci,
    combine_runs,
    log_t_interval,
    paired_t_interval,
    t_interval,
    welch_interval,
)

T2 = 4.302652729749462  # t_{2, 0.975}: 3 seeds


def test_t_interval_by_hand():
    # 0.2, 0.4, 0.6: mean 0.4, sd 0.2, se 0.2 / sqrt(3) = 0.11547, half width 4.30265 * 0.115470 = 0.496828
    mean, low, high = t_interval([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4)
    assert (low, high) == pytest.approx((0.4 - T2 * 0.2 / math.sqrt(3), 0.4 + T2 * 0.2 / math.sqrt(3)))
    assert high - 0.4 == pytest.approx(0.496828, abs=1e-6)
    assert t_interval([0.1, 0.1, 0.1]) == (0.1, 0.1, 0.1)  # no spread seen
    mean, low, high = t_interval([0.3])  # one run: no interval
    assert mean == 0.3 and math.isnan(low) and math.isnan(high)


def test_paired_t_interval_by_hand_on_the_power_comparison():
    # docs/results.md: avg@4 on 250 x 4 per seed, ibpo_plain and gspo_large_group (seeds 0, 1, 2)
    ibpo, gspo = [0.248, 0.318, 0.374], [0.395, 0.373, 0.349]
    # differences -0.147, -0.055, +0.025: mean -0.059; deviations -0.088, +0.004, +0.084;
    # sd = sqrt((0.007744 + 0.000016 + 0.007056) / 2) = 0.086070; half width 4.3027 * 0.086070 / sqrt(3) = 0.21381
    mean, low, high = paired_t_interval(ibpo, gspo)
    assert mean == pytest.approx(-0.059)
    assert (low, high) == pytest.approx((-0.059 - 0.21381, -0.059 + 0.21381), abs=1e-5)
    assert round(low, 2) == -0.27 and round(high, 2) == 0.15
    with pytest.raises(ValueError, match="as many"):
        paired_t_interval([1.0, 2.0], [1.0])


def test_welch_interval_by_hand():
    # a: 1, 2, 3 (mean 2, var 1); b: 0, 0, 2, 2 (mean 1, var 4/3)
    # se^2 = 1/3 + (4/3)/4 = 2/3; df = (2/3)^2 / ((1/3)^2 / 2 + (1/3)^2 / 3) = (4/9) / (5/54) = 4.8
    from scipy import stats

    diff, low, high = welch_interval([1.0, 2.0, 3.0], [0.0, 0.0, 2.0, 2.0])
    half = stats.t.ppf(0.975, 4.8) * math.sqrt(2 / 3)
    assert diff == pytest.approx(1.0) and (low, high) == pytest.approx((1.0 - half, 1.0 + half))
    with pytest.raises(ValueError, match="at least 2"):
        welch_interval([1.0], [1.0, 2.0])


def test_log_t_interval_is_multiplicative():
    # ratios 0.5 and 2: logs -/+0.6931, geometric mean 1; sd 0.9803, se 0.6931, t_{1, 0.975} = 12.706
    mean, low, high = log_t_interval([0.5, 2.0])
    assert mean == pytest.approx(1.0)
    assert (low, high) == pytest.approx((math.exp(-12.7062 * 0.693147), math.exp(12.7062 * 0.693147)), rel=1e-4)
    assert low * high == pytest.approx(1.0)  # symmetric on the log scale
    with pytest.raises(ValueError, match="positive"):
        log_t_interval([1.0, -1.0])


def test_with_three_seeds_the_percentile_bootstrap_covers_75_percent_and_t_95():
    # Three seeds from N(0, 1). The bootstrap's 2.5% and 97.5% percentiles of the resample means
    # are the smallest and largest value (three copies of the minimum: probability 1/27 > 2.5%),
    # so it covers the mean when the three do not all fall on one side: 1 - 2 * (1/2)^3 = 0.75.
    rng = np.random.default_rng(0)
    trials = 1000
    boot = t = 0
    for trial in range(trials):
        x = rng.normal(size=3)
        _, low, high = bootstrap_ci(x, n_resamples=2000, seed=trial)
        assert (low, high) == pytest.approx((x.min(), x.max()))
        boot += low <= 0.0 <= high
        _, low, high = t_interval(x)
        t += low <= 0.0 <= high
    assert 0.70 < boot / trials < 0.80
    assert 0.93 < t / trials < 0.97


def test_bootstrap_is_deterministic_for_a_seed():
    values = [0.41, 0.45, 0.39, 0.44, 0.47]
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    # With 5 values the resample means are few discrete numbers and 10k resamples put the
    # percentiles on the same ones for most seeds; many values and few resamples show the seed.
    many = np.random.default_rng(0).normal(size=50).tolist()
    assert bootstrap_ci(many, n_resamples=200, seed=3) != bootstrap_ci(many, n_resamples=200, seed=4)


def test_mean_inside_interval():
    values = [0.41, 0.45, 0.39, 0.44, 0.47]
    mean, low, high = bootstrap_ci(values)
    assert mean == pytest.approx(np.mean(values))
    assert min(values) <= low <= mean <= high <= max(values)


def test_constant_sample_has_no_width():
    assert bootstrap_ci([0.1, 0.1, 0.1]) == (0.1, 0.1, 0.1)
    assert bootstrap_ci([0.3]) == (0.3, 0.3, 0.3)


def test_more_spread_gives_wider_interval():
    rng = np.random.default_rng(0)
    base = rng.normal(size=20)
    _, lo1, hi1 = bootstrap_ci(0.5 + 0.01 * base)
    _, lo2, hi2 = bootstrap_ci(0.5 + 0.10 * base)
    assert hi2 - lo2 > hi1 - lo1 > 0


def test_higher_confidence_gives_wider_interval():
    values = [0.2, 0.5, 0.3, 0.6, 0.4]
    _, lo90, hi90 = bootstrap_ci(values, confidence=0.9)
    _, lo99, hi99 = bootstrap_ci(values, confidence=0.99)
    assert hi99 - lo99 >= hi90 - lo90


@pytest.mark.parametrize("bad", [[], [float("nan"), 1.0], [[1.0, 2.0]]])
def test_bad_values_raise(bad):
    with pytest.raises(ValueError):
        bootstrap_ci(bad)


def _run(seed, avg):
    return {"benchmark": "gsm8k", "model": "m", "ckpt": None, "k": 4, "n_problems": 3, "seed": seed,
            "avg@k": avg, "pass@1": avg, "pass@k": 0.9, "maj@k": avg, "response_len": 10.0 + seed,
            "truncated_frac": 0.0, "unscorable_frac": 0.0}


def test_combine_runs_from_files_and_dicts(tmp_path):
    paths = []
    for seed, avg in enumerate([0.4, 0.5, 0.45]):
        p = tmp_path / f"run{seed}.json"
        p.write_text(json.dumps(_run(seed, avg)))
        paths.append(str(p))
    combined = combine_runs(paths[:2] + [_run(2, 0.45)])
    assert combined["n_runs"] == 3 and combined["seeds"] == [0, 1, 2] and not combined["duplicate_seeds"]
    assert combined["interval"] == "t"
    avg = combined["metrics"]["avg@k"]
    assert avg["values"] == [0.4, 0.5, 0.45]
    assert (avg["mean"], avg["low"], avg["high"]) == pytest.approx(t_interval([0.4, 0.5, 0.45]))
    assert avg["low"] < 0.4 and avg["high"] > 0.5  # wider than the runs' range, as 3 seeds need
    assert combined["metrics"]["pass@k"] == {"mean": 0.9, "low": 0.9, "high": 0.9, "values": [0.9] * 3}
    boot = combine_runs(paths, interval="bootstrap")["metrics"]["avg@k"]
    assert (boot["low"], boot["high"]) == pytest.approx((0.4, 0.5))  # the range of the three
    single = combine_runs(paths[:1])["metrics"]["avg@k"]
    assert single == {"mean": 0.4, "low": None, "high": None, "values": [0.4]}
    with pytest.raises(ValueError, match="interval"):
        combine_runs(paths, interval="bca")


def test_combine_runs_rejects_mixed_evaluations():
    other = dict(_run(1, 0.5), benchmark="math500")
    with pytest.raises(ValueError, match="benchmark"):
        combine_runs([_run(0, 0.4), other])
    with pytest.raises(ValueError, match="at least one"):
        combine_runs([])


def test_combine_runs_flags_duplicate_seeds():
    assert combine_runs([_run(0, 0.4), _run(0, 0.4)])["duplicate_seeds"]
