"""Benchmark evaluation: sampling k responses per problem, avg@k / pass@k / maj@k (math) or
pass@k with the code sandbox, the IBPO paper's baselines (test-time compare-and-correct,
Best-of-N), and confidence intervals across seeds (Student's t; METHOD.md section 6).

``evaluate`` loads transformers lazily (the command is ``ibpo_lit.evaluation.cli``); the metrics
import only torch, numpy and math-verify.
"""
from ibpo_lit.evaluation.baselines import correction_metrics, parse_baselines
from ibpo_lit.evaluation.bootstrap import bootstrap_ci, combine_runs, paired_t_interval, t_interval
from ibpo_lit.evaluation.metrics import (
    avg_at_k,
    maj_at_k,
    majority_answer,
    mean_pass_at_k,
    mean_test_fraction,
    pass_at_k,
)

__all__ = [
    "avg_at_k",
    "bootstrap_ci",
    "combine_runs",
    "correction_metrics",
    "evaluate",
    "extract_answer",
    "maj_at_k",
    "majority_answer",
    "mean_pass_at_k",
    "mean_test_fraction",
    "paired_t_interval",
    "parse_baselines",
    "pass_at_k",
    "t_interval",
]


def __getattr__(name: str):
    if name == "evaluate":
        from ibpo_lit.evaluation.runner import evaluate

        return evaluate
    if name == "extract_answer":  # the math task's answer (`ibpo_lit.rewards.answers`), for maj@k
        from ibpo_lit.rewards.answers import extract_answer

        return extract_answer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
