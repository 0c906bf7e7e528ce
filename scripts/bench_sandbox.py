"""The code sandbox's cost per program, and every canonical solution through it.

    python scripts/bench_sandbox.py --data ../shared/data --out results/bench_sandbox/sandbox.json
    python scripts/bench_sandbox.py --data tests/fixtures --limit 4            # seconds, for tests

Two arms over the same programs, in one invocation:
- ``sandboxed``: what training uses (`detect_isolation`: bwrap namespaces, a per-run uid as root,
  cgroups), ``--workers`` programs at a time in a `SandboxPool`;
- ``baseline``: the same judge with no namespaces, no uid change and no cgroups
  (`Isolation.none`): the two interpreter starts and the protocol, without the containment.
Reported per arm: programs, wall seconds, programs per second, mean seconds per program (each
run's own judge-start-to-verdict time) and the status counts; the ratio of the sandboxed arm's
seconds per program to the baseline's is the containment's cost. The programs are the
benchmarks' canonical solutions (HumanEval ``prompt + canonical_solution``, MBPP ``code``), so
every one should pass: a failure is a harness defect, listed by task.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ibpo_lit.data.code_tasks import load_humaneval, load_mbpp, load_mbpp_sanitized  # noqa: E402
from ibpo_lit.rewards.code import SandboxError, run_code_tests  # noqa: E402
from ibpo_lit.rewards.code import detect_isolation  # noqa: E402
from ibpo_lit.rewards.sandbox.isolation import Isolation  # noqa: E402

FILES = {"humaneval": ("humaneval.jsonl", load_humaneval), "mbpp": ("mbpp_full.jsonl", load_mbpp),
         "mbpp_sanitized": ("mbpp_sanitized.jsonl", load_mbpp_sanitized)}


def _tasks(data: Path, limit: int | None) -> list:
    tasks = []
    for name, (file, loader) in FILES.items():
        if (data / file).is_file():
            tasks += loader(data / file, limit=limit)
    if not tasks:
        raise SystemExit(f"no benchmark files ({', '.join(f for f, _ in FILES.values())}) in {data}")
    return tasks


def _arm(tasks: list, iso: Isolation, workers: int) -> dict:
    def one(task):
        try:
            return task.uid, run_code_tests(task.reference, task.spec, extract=False, isolation=iso)
        except SandboxError as e:
            return task.uid, e

    start = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, tasks))
    wall = time.monotonic() - start
    done = [r for _, r in results if not isinstance(r, Exception)]
    statuses = Counter(r.status for r in done)
    statuses["unscorable"] = len(results) - len(done)
    return {
        "programs": len(results), "wall_s": round(wall, 2), "programs_per_s": round(len(results) / wall, 2),
        "mean_s_per_program": round(statistics.fmean(r.seconds for r in done), 4) if done else None,
        "statuses": dict(sorted(statuses.items())),
        "not_passing": {uid: (r.status, r.detail) if not isinstance(r, Exception) else ("unscorable", str(r))
                        for uid, r in results if isinstance(r, Exception) or r.status != "pass"},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="folder with humaneval.jsonl, mbpp_full.jsonl, "
                        "mbpp_sanitized.jsonl (any present)")
    parser.add_argument("--limit", type=int, default=None, help="tasks per benchmark (default: all)")
    parser.add_argument("--workers", type=int, default=2, help="programs at once (default: 2)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    tasks = _tasks(args.data, args.limit)
    iso = detect_isolation()
    report = {"workers": args.workers, "isolation": {"bwrap": iso.bwrap, "per_run_uid": iso.per_run_uid,
                                                     "cgroups": sorted(iso.cgroups)},
              "baseline": _arm(tasks, Isolation.none(), args.workers), "sandboxed": _arm(tasks, iso, args.workers)}
    base, boxed = report["baseline"]["mean_s_per_program"], report["sandboxed"]["mean_s_per_program"]
    report["cost_ratio"] = round(boxed / base, 2) if base and boxed else None
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
