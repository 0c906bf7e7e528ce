"""bootstrap_ci and combine_runs."""
import json

import numpy as np
import pytest

from ibpo_lit.evaluation.bootstrap import bootstrap_ci, combine_runs


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
    avg = combined["metrics"]["avg@k"]
    assert avg["values"] == [0.4, 0.5, 0.45]
    assert avg["mean"] == pytest.approx(0.45)
    assert avg["low"] <= avg["mean"] <= avg["high"]
    assert combined["metrics"]["pass@k"] == {"mean": 0.9, "low": 0.9, "high": 0.9, "values": [0.9] * 3}


def test_combine_runs_rejects_mixed_evaluations():
    other = dict(_run(1, 0.5), benchmark="math500")
    with pytest.raises(ValueError, match="benchmark"):
        combine_runs([_run(0, 0.4), other])
    with pytest.raises(ValueError, match="at least one"):
        combine_runs([])


def test_combine_runs_flags_duplicate_seeds():
    assert combine_runs([_run(0, 0.4), _run(0, 0.4)])["duplicate_seeds"]
