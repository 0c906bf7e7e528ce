"""``python -m ibpo_lit evaluate``: evaluate a policy, or combine runs over seeds.

    python -m ibpo_lit evaluate --model_name_or_path M --benchmark gsm8k [--path F.jsonl]
        [--k 64] [--seed 0] [--ckpt_path runs/x/checkpoints/last.ckpt] [--output run.json]
    python -m ibpo_lit evaluate --model_name_or_path M --benchmark humaneval --path HumanEval.jsonl
        [--baselines test_time_correction,best_of_n] [--output run.json]
    python -m ibpo_lit evaluate --model_name_or_path M --benchmark mydata --path my.parquet
        --question_key problem --answer_format plain      # your own data, scored as math
    python -m ibpo_lit evaluate --combine seed0.json seed1.json ... [--output combined.json]

The evaluate options are ``ibpo_lit.evaluation.runner.evaluate``'s parameters, with their
``--help`` text taken from its docstring (jsonargparse); ``--config FILE`` reads them from YAML.
"""
from __future__ import annotations

import sys
from typing import Optional

from jsonargparse import ActionConfigFile, ArgumentParser

from ibpo_lit.evaluation.bootstrap import combine_runs
from ibpo_lit.evaluation.report import combined_table, run_table, write_json
from ibpo_lit.evaluation.runner import evaluate

PROG = "python -m ibpo_lit evaluate"


def build_parser() -> ArgumentParser:
    """The evaluate parser: every ``evaluate`` parameter plus ``--output``."""
    parser = ArgumentParser(
        prog=PROG,
        description="Sample k responses per benchmark problem and report avg@k, pass@1, pass@k "
        "and maj@k (math), or avg@k, pass@1, pass@k, the share of tests passed and the sandbox's status "
        "counts (code: humaneval, mbpp, mbpp_sanitized, livecodebench). Your own data: any other --benchmark "
        "name with --path (JSONL, JSON, Parquet, Arrow, a saved dataset or a datasets name), its fields named "
        "by --question_key/--answer_key/--answer_format as training's data.* keys, scored by the math "
        "verifier. --baselines adds the IBPO paper's "
        "baselines from the same samples: test-time compare-and-correct (verifier-free, or an ORACLE that "
        "picks the reference with the gold) and Best-of-N, which with the gold verifier equals pass@N. "
        "To combine runs of several seeds into a mean and 95% t-interval over the seeds: "
        f"{PROG} --combine RUN1.json RUN2.json ... [--output PATH].",
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML file with any of these options.")
    parser.add_function_arguments(evaluate, fail_untyped=True)
    parser.add_argument("--output", type=Optional[str], default=None, help="Write the result JSON here.")
    return parser


def build_combine_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=f"{PROG} --combine",
                            description="Mean and confidence interval per metric across runs (seeds).")
    parser.add_argument("--combine", type=str, nargs="+", required=True, help="Result JSONs of one evaluation, one per seed.")
    parser.add_argument("--confidence", type=float, default=0.95, help="Coverage of the interval.")
    parser.add_argument("--interval", type=str, choices=["t", "bootstrap"], default="t",
                        help="t: Student's t over the runs (right for a few seeds); bootstrap: percentile "
                             "bootstrap, which with 3 runs is their range and covers ~75%%, not 95%%.")
    parser.add_argument("--n_resamples", type=int, default=10000, help="Resamples of --interval bootstrap.")
    parser.add_argument("--output", type=Optional[str], default=None, help="Write the combined JSON here.")
    return parser


def evaluate_main(argv: list[str] | None = None) -> int:
    """Run the evaluate command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--combine" or a.startswith("--combine=") for a in argv):
        return _combine_main(argv)
    parser = build_parser()
    cfg = parser.instantiate(parser.parse_args(argv))  # `--vllm.*` becomes a VLLMConfig
    kwargs = {k: v for k, v in vars(cfg).items() if k not in ("config", "output", "__path__")}
    result = evaluate(**kwargs)
    if cfg.output:
        write_json(result, cfg.output)
    print(run_table(result))
    return 0


def _combine_main(argv: list[str]) -> int:
    cfg = build_combine_parser().parse_args(argv)
    combined = combine_runs(cfg.combine, confidence=cfg.confidence, n_resamples=cfg.n_resamples, interval=cfg.interval)
    if combined["duplicate_seeds"]:
        print(f"warning: runs share seeds {combined['seeds']}; the interval is too narrow", file=sys.stderr)
    if cfg.output:
        write_json(combined, cfg.output)
    print(combined_table(combined))
    return 0


if __name__ == "__main__":
    raise SystemExit(evaluate_main())
