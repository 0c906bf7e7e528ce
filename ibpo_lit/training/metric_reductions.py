"""How each step metric combines across the run's processes: declared once, here.

`IBPOModule` logs a step's metrics after one collective (`RankSync.reduce_metrics`): each rank
reports what it saw, and the run's value is their ``sum`` (counts of events: every rank counts
its own rows), ``max`` / ``min`` (extremes, and seconds: a step lasts as long as its slowest
rank), or ``mean`` (rates and fractions of each rank's share; values every rank agrees on).
Before this table, which metrics were counts was listed in two places that disagreed, and
``train/masked_truncated``, ``train/corrections_truncated`` and
``train/corrections_skipped_long`` were averaged over ranks instead of summed (half the count
on two processes), ``train/ratio_max`` averaged instead of maximised.

Dynamic sampling's rounds combine the same way within a rank (`GroupFilter.metrics`): what is
declared ``sum`` adds up over the rounds, the rest is averaged.

Families (``reward/<label>``, ``data/<stat>``) are declared by prefix. `reduction_of` answers
for a name; `undeclared` lists the names it cannot answer for (tests/test_metric_reductions.py
fails on any metric a feature-rich run logs that is not declared; an undeclared one is averaged).
"""
from __future__ import annotations

from typing import Iterable

SUM, MEAN, MAX, MIN = "sum", "mean", "max", "min"

REDUCTIONS: dict[str, str] = {
    # counts of events, each rank counting its own rows
    "train/unscorable": SUM, "train/corrections": SUM, "train/reward_timeouts": SUM, "train/reward_errors": SUM,
    "train/reward_none": SUM, "train/filtered_groups": SUM, "train/masked_truncated": SUM,
    "train/corrections_truncated": SUM, "train/corrections_skipped_long": SUM,
    "ciw/cache_hits": SUM, "ciw/forward_passes": SUM, "ciw/forward_tokens": SUM, "ciw/rows_scored": SUM,
    # each rank's loss is its share of the global mini-batch's; each rank's throughput its own
    "train/loss": SUM, "train/tokens_per_s": SUM,
    # extremes and durations
    "train/ratio_max": MAX, "train/ratio_min": MIN, "timing/step_s": MAX, "timing/generate_s": MAX,
    "timing/correct_s": MAX, "timing/update_s": MAX, "timing/callbacks_s": MAX, "ciw/overhead_s": MAX,
    # the same on every rank (decided together): max keeps it whatever a rank reports
    "train/nonfinite_steps": MAX, "train/generation_rounds": MAX, "train/grad_norm": MAX, "train/lr": MAX,
    "train/informative_groups": MAX, "train/trained_groups": MAX, "train/missing_groups": MAX,  # all ranks' already
    # rates, fractions and means of each rank's share
    "train/reward": MEAN, "train/shaped_reward": MEAN, "train/response_len": MEAN, "train/truncated_frac": MEAN,
    "train/zero_adv_frac": MEAN, "train/clip_frac": MEAN, "train/ratio_mean": MEAN, "train/entropy": MEAN,
    "train/kl": MEAN, "train/overlong_penalty": MEAN, "train/shaped_frac": MEAN, "train/rewrite_rate": MEAN,
    "train/correction_success": MEAN, "train/correction_reward": MEAN, "train/correction_distance": MEAN,
    "train/correction_alpha": MEAN, "rollout/logprob_mismatch": MEAN, "ciw/marker_frac": MEAN,
    "ciw/spans_per_rollout": MEAN, "ciw/distractor_frac": MEAN, "ciw/drop_mean": MEAN, "ciw/weight_answer": MEAN,
    "ciw/weight_reasoning": MEAN, "rollout/probe_mismatch": MAX, "rollout/sync_s": MAX,
    # rollout correction (`algorithms/rollout_correction.py`): each rank's weights, shares and KLs
    # over its rows; the ratios' extremes over every rank's
    "rollout_corr/weight_mean": MEAN, "rollout_corr/weight_std": MEAN, "rollout_corr/truncated_frac": MEAN,
    "rollout_corr/rejected_frac": MEAN, "rollout_corr/rejected_seq_frac": MEAN, "rollout_corr/seq_kl_k1": MEAN,
    "rollout_corr/seq_kl_k3": MEAN, "rollout_corr/ratio_max": MAX, "rollout_corr/ratio_min": MIN,
    # one step off-policy (`training/off_policy.py`): the lag is the same on every rank (asserted);
    # when in the step each phase started and ended, the slowest rank's; the overlap, the rank
    # that overlapped least (> 0: every rank did); the producer's and the rollouts' seconds
    "rollout/staleness": MAX, "time/ahead_start": MAX, "time/ahead_end": MAX, "time/update_start": MAX,
    "time/update_end": MAX, "time/overlap_s": MIN, "timing/rollouts_s": MAX, "timing/ahead_wait_s": MAX,
    "timing/ahead_generate_s": MAX, "timing/ahead_correct_s": MAX,
    # tool-integrated rollouts: per rollout and per call on each rank's rows; a rank's tool time
    "rollout/tool_calls": MEAN, "rollout/tool_errors": MEAN, "rollout/tool_call_s": MEAN, "timing/tool_s": MAX,
}
PREFIXES: dict[str, str] = {
    "reward/": MEAN,  # each reward's mean over the rank's rows
    "data/": SUM,  # each rank's data module counts its own records
}


def reduction_of(name: str) -> str | None:
    """The declared reduction of ``name`` (None: undeclared)."""
    if name in REDUCTIONS:
        return REDUCTIONS[name]
    return next((r for prefix, r in PREFIXES.items() if name.startswith(prefix)), None)


def undeclared(names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if reduction_of(n) is None)
