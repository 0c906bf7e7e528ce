"""Benchmark evaluation: sampling k responses per problem, avg@k / pass@k / maj@k (math) or
pass@k with the code sandbox, the IBPO paper's baselines (test-time compare-and-correct,
Best-of-N), and bootstrap confidence intervals across seeds (METHOD.md section 6).

``evaluate`` and ``evaluate_main`` load transformers lazily; the metrics import only torch,
numpy and math-verify.
"""
from ibpo_lit.evaluation.baselines import correction_metrics, parse_baselines
from ibpo_lit.evaluation.bootstrap import bootstrap_ci, combine_runs
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
    "evaluate_main",
    "extract_answer",
    "maj_at_k",
    "majority_answer",
    "mean_pass_at_k",
    "mean_test_fraction",
    "parse_baselines",
    "pass_at_k",
]


def __getattr__(name: str):
    if name == "evaluate":
        from ibpo_lit.evaluation.runner import evaluate

        return evaluate
    if name == "evaluate_main":
        from ibpo_lit.evaluation.cli import evaluate_main

        return evaluate_main
    if name == "extract_answer":
        from ibpo_lit.evaluation.answers import extract_answer

        return extract_answer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
