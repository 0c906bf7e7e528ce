"""Comparison report pieces on hand-made summaries."""
import math

import pytest

from ibpo_lit.evaluation.bootstrap import t_interval
from ibpo_lit.experiments.report import gradient_variance_ratio, markdown_table, paired_difference
from ibpo_lit.experiments.runs import at_compute


def test_values_pair_with_the_compute_logged_at_or_before_their_step():
    series = {"compute/flops": [(0, 10.0), (1, 20.0), (2, 30.0)], "val/accuracy": [(1, 0.5), (3, 0.7)]}
    assert at_compute(series, "val/accuracy") == [(20.0, 0.5), (30.0, 0.7)]
    assert at_compute(series, "train/reward") == []


def summary(arm, seed, grad_var, final_val):
    return {"arm": arm, "seed": seed, "steps": 4, "flops": 2e12, "grad_var_trace": grad_var, "final_val": final_val}


def test_table_reports_mean_and_t_interval_per_arm():
    runs = [summary("a", 0, 1.0, 0.2), summary("a", 1, 1.0, 0.4), summary("b", 0, 0.5, 0.3)]
    table = markdown_table(runs)
    mean, low, high = t_interval([0.2, 0.4])  # 0.3 -+ 12.706 * 0.1414 / sqrt(2) = 0.3 -+ 1.271
    assert (low, high) == pytest.approx((-0.971, 1.571), abs=1e-3)
    assert "| 0.300 [0.000, 1.000] |" in table  # arm a's final val, 2 seeds: an accuracy, clipped to [0, 1]
    row_b = next(line for line in table.splitlines() if line.startswith("| b |"))
    assert "| 0.300 |" in row_b  # one seed: no interval
    assert "| 2.0 |" in row_b  # FLOPs shown in TFLOP


def test_gradient_variance_ratio_pairs_seeds():
    runs = [summary("gspo", 0, 2.0, 0), summary("gspo", 1, 4.0, 0), summary("ibpo", 0, 1.0, 0), summary("ibpo", 1, 3.0, 0)]
    mean, low, high, seeds = gradient_variance_ratio(runs, "ibpo", "gspo")
    # seed 0: 1/2 = .5, seed 1: 3/4 = .75 -> geometric mean sqrt(.375) = .612
    assert mean == pytest.approx(math.sqrt(0.375)) and low < mean < high and seeds == 2
    assert gradient_variance_ratio(runs, "ibpo", "missing") is None


def test_paired_difference_pairs_seeds_with_a_t_interval():
    runs = [summary("gspo", s, 1.0, v) for s, v in enumerate([0.395, 0.373, 0.349])]
    runs += [summary("ibpo", s, 1.0, v) for s, v in enumerate([0.248, 0.318, 0.374])]
    # per seed -0.147, -0.055, +0.025: -0.059 -+ 4.3027 * 0.086070 / sqrt(3) = [-0.273, +0.155]
    mean, low, high, seeds = paired_difference(runs, "ibpo", "gspo")
    assert (mean, low, high, seeds) == pytest.approx((-0.059, -0.27281, 0.15481, 3), abs=1e-5)
    assert paired_difference(runs, "ibpo", "missing") is None
