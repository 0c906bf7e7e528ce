"""How long the command line takes to answer: help, and the tiny config's first training step.

    python scripts/bench_startup.py --out results/bench_startup/startup.json
    python scripts/bench_startup.py --baseline-tree /tmp/before --repeats 3   # against an older checkout

Measured, each ``--repeats`` times, for this checkout (and for ``--baseline-tree`` when given,
interleaved so both see the same machine, each going first in every other round):
- ``help``, ``fit_help``: wall seconds of ``python -m ibpo_lit --help`` and ``fit --help``, with
  an empty help cache (``cold``) and right after (``kept``; `ibpo_lit.help_cache`);
- ``first_step``: seconds from the command to the end of the first optimizer step of
  ``configs/tiny.yaml`` (the moment its first ``checkpoints/last.ckpt`` appears: the config
  saves every step, in every version of the project);
- ``import_lightning``: wall seconds of ``python -c "import lightning.pytorch"``, the floor every
  command that builds the Trainer's parser pays.
Each also as CPU seconds (``*_cpu``: user + system of the process, its own children not
counted), which a machine shared with other work disturbs far less than wall seconds. The report
gives the median of each and the ratio of the baseline's median to this checkout's.
Both trees' sources are compiled once before the first round (the runs do not write bytecode, so
a fresh worktree would otherwise compile every module in every run while this checkout reads its
``__pycache__``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _env(tree: Path, cache: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "IBPO_LIT_CACHE": cache, "PYTHONDONTWRITEBYTECODE": "1"}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(cmd: list[str], tree: Path, cache: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``cmd``."""
    start, cpu = time.perf_counter(), _children_cpu_s()
    subprocess.run(cmd, cwd=tree, env=_env(tree, cache), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, timeout=600)
    return time.perf_counter() - start, _children_cpu_s() - cpu


def _first_step(tree: Path, cache: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the fit's own process) to the end of the first step."""
    with tempfile.TemporaryDirectory() as root:
        ckpt = Path(root) / "checkpoints" / "last.ckpt"
        cmd = [sys.executable, "-m", "ibpo_lit", "fit", "--config", str(tree / "configs" / "tiny.yaml"),
               "--trainer.max_steps", "2", "--trainer.default_root_dir", root]
        start, cpu = time.perf_counter(), _children_cpu_s()
        proc = subprocess.Popen(cmd, cwd=tree, env=_env(tree, cache), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            while not ckpt.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"the tiny fit in {tree} ended (code {proc.returncode}) before its first step")
                time.sleep(0.01)
            wall = time.perf_counter() - start
        finally:
            proc.kill()
            proc.wait()
        return wall, _children_cpu_s() - cpu


def measure(tree: Path) -> dict[str, float]:
    """One round of every measurement for the checkout at ``tree``."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        for name, argv in (("help", ["--help"]), ("fit_help", ["fit", "--help"])):
            cmd = [sys.executable, "-m", "ibpo_lit", *argv]
            out[f"{name}_cold"], out[f"{name}_cold_cpu"] = _timed(cmd, tree, cache)
            out[f"{name}_kept"], out[f"{name}_kept_cpu"] = _timed(cmd, tree, cache)
        out["first_step"], out["first_step_cpu"] = _first_step(tree, cache)
        out["import_lightning"], out["import_lightning_cpu"] = _timed([sys.executable, "-c", "import lightning.pytorch"],
                                                                      tree, cache)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="an older checkout (e.g. `git worktree add /tmp/before <commit>`), measured alike")
    parser.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    args = parser.parse_args()
    trees = {"this": REPO} if args.baseline_tree is None else {"this": REPO, "baseline": args.baseline_tree.resolve()}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for tree in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "ibpo_lit"), str(tree / "callbacks")],
                       stdout=subprocess.DEVNULL, check=True, timeout=600)
    for round_ in range(args.repeats):
        order = list(trees.items())
        for name, tree in order if round_ % 2 == 0 else order[::-1]:  # neither tree always goes first
            runs[name].append(measure(tree))
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    result = {"repeats": args.repeats, "cpus": os.cpu_count(), "median_s": medians, "runs": runs}
    if "baseline" in medians:
        result["baseline_over_this"] = {k: medians["baseline"][k] / medians["this"][k] for k in medians["this"]}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
