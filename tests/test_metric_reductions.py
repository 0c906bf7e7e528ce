"""Every metric a step logs has a declared reduction across processes
(`ibpo_lit.training.metric_reductions`), and the reductions do what they say."""
from __future__ import annotations

import math
import os
import sys

import pytest

from ibpo_lit.__main__ import main
from ibpo_lit.module import IBPOModule
from ibpo_lit.scale.collectives import RankSync
from ibpo_lit.training.metric_reductions import MAX, MEAN, MIN, SUM, reduction_of, undeclared

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_every_metric_of_a_feature_rich_run_is_declared(tmp_path, monkeypatch, one_intra_op_thread):
    logged: set[str] = set()
    original = IBPOModule._log_metrics

    def record(self, metrics):
        logged.update(metrics)
        return original(self, metrics)

    monkeypatch.setattr(IBPOModule, "_log_metrics", record)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    main(["fit", "--config", os.path.join(ROOT, "configs", "tiny_ciw.yaml"), "--trainer.max_steps", "2",
          "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
          "--model.algorithm.beta_kl", "0.01", "--model.algorithm.entropy_coef", "0.001",
          "--model.algorithm.overlong.mask_truncated", "true", "--model.algorithm.overlong.soft_buffer", "4",
          "--model.algorithm.dynamic_sampling.enabled", "true", "--model.rollout.num_mini_batches", "2"])
    assert len(logged) > 40
    assert undeclared(logged) == []


def test_the_counts_the_issue_found_averaged_are_summed():
    for name in ("train/masked_truncated", "train/corrections_truncated", "train/corrections_skipped_long"):
        assert reduction_of(name) == SUM
    assert reduction_of("train/ratio_max") == MAX and reduction_of("train/ratio_min") == MIN
    assert reduction_of("reward/math") == MEAN and reduction_of("data/skipped_records") == SUM
    # dynamic sampling's group counts are every rank's already (the same on each): not summed again
    assert reduction_of("train/informative_groups") == MAX and reduction_of("train/filtered_groups") == SUM
    assert reduction_of("train/not_a_metric") is None


class TwoRanks(RankSync):
    """A `RankSync` whose gather returns two ranks' reports (no process group needed)."""

    def __init__(self, other: dict[str, float]):
        super().__init__(world_size=2)
        self.other = other

    @property
    def active(self) -> bool:
        return True

    def gather(self, obj):
        return [obj, self.other]


def test_reduce_metrics_sums_maximises_and_averages_over_the_ranks_that_report():
    sync = TwoRanks({"train/corrections_truncated": 3.0, "train/ratio_max": 1.5, "train/reward": 0.0,
                     "timing/step_s": 9.0, "train/entropy": math.nan})
    out = sync.reduce_metrics({"train/corrections_truncated": 2.0, "train/ratio_max": 1.2, "train/reward": 1.0,
                               "timing/step_s": 4.0, "train/entropy": 2.0, "train/only_here": 5.0}, reduction_of)
    assert out["train/corrections_truncated"] == 5.0  # a count: summed (averaged, it read 2.5)
    assert out["train/ratio_max"] == 1.5 and out["timing/step_s"] == 9.0
    assert out["train/reward"] == 0.5
    assert out["train/entropy"] == 2.0  # a rank without a finite value does not count
    assert out["train/only_here"] == 5.0


def test_the_off_policy_metrics_are_declared():
    """What a ``max_staleness: 1`` step logs beyond the on-policy step's (its runs need the vLLM
    server: tests/rollout/test_max_staleness.py checks them all declared on 2 processes)."""
    from ibpo_lit.training.off_policy import Produced, overlap_metrics
    from ibpo_lit.training.step_metrics import StepClock

    clock = StepClock()
    for mark in ("rollouts", "callbacks", "update", "ahead_wait"):
        clock.mark(mark)
    ahead = Produced(None, {}, {}, seconds={"generate": 1.0, "correct": 0.5}, started=clock.start,
                     finished=clock.marks["ahead_wait"])
    names = [*overlap_metrics(clock, ahead, 1.0), *(f"timing/{phase}_s" for phase in clock.seconds())]
    assert undeclared(names) == []
    assert reduction_of("rollout/staleness") == MAX and reduction_of("time/overlap_s") == MIN
