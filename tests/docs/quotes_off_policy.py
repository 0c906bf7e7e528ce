"""The numbers docs/benchmarks.md quotes from the runs of scripts/bench_off_policy.py (issue 44
item 5): the 16-step run's medians, the ratio of the step times, and both arms' reward, response
length and wall time at every step; the 4-step run with ``OMP_WAIT_POLICY=PASSIVE`` beside the
16-step run's first 4 steps; each from the run's summary.json and its arms' steps.jsonl (never its
summary.md); and what docs/rollouts.md takes from them."""
from __future__ import annotations

import json
import statistics
from functools import cache

from quote_checks import BENCH_MD, Claim, Quote

ROLLOUTS_MD = "docs/rollouts.md"
from results_files import RESULTS, result_json

RUN = "bench_off_policy/steps16"
SOURCE = f"results/{RUN}/summary.json, {{sync,off_policy}}/steps.jsonl"
SECTION = "16 steps, the quick start's length"  # its section of docs/benchmarks.md
ARMS = (("sync", "synchronous (`max_staleness: 0`)"), ("off_policy", "one step off-policy (`max_staleness: 1`)"))


PASSIVE = "bench_off_policy/steps4_passive"  # the 4 steps with OpenMP's threads asleep when idle
PASSIVE_SOURCE = f"results/{PASSIVE}/summary.json, {{sync,off_policy}}/steps.jsonl, and {SOURCE}"
PASSIVE_SECTION = "4 steps with OpenMP's threads asleep when idle"


@cache
def summary(run: str = RUN) -> dict:
    return result_json(f"{run}/summary.json")


@cache
def steps(arm: str, run: str = RUN) -> list[dict]:
    return [json.loads(line) for line in (RESULTS / run / arm / "steps.jsonl").read_text().splitlines()]


def _arm_row(arm: str) -> list[float]:
    """Its median step, median after step 0, median generation + corrections (its own step's, or the
    thread's of the next step), median update; off-policy also what it waited for the thread and the
    overlap; the 16 steps' total."""
    s = summary()["arms"][arm]
    m, a = s["median"], s["median_after_first"]
    row = [m["wall_s"], a["wall_s"], statistics.median(r["generate_s"] + r["correct_s"] for r in steps(arm)),
           m["update_s"]]
    if arm == "off_policy":
        row += [m["ahead_wait_s"], m["time/overlap_s"]]
    return row + [s["total_wall_s"] / 60]


def _step_row(i: int) -> list[float]:
    sync, off = steps("sync")[i], steps("off_policy")[i]
    return [sync["reward"], off["reward"], sync["response_len"], off["response_len"], sync["wall_s"], off["wall_s"]]


def _means() -> list[float]:
    """Each arm's mean training reward over all steps, then over the second half."""
    rewards = {arm: [r["reward"] for r in steps(arm)] for arm, _ in ARMS}
    half = len(rewards["sync"]) // 2
    return [statistics.fmean(rewards["sync"]), statistics.fmean(rewards["off_policy"]),
            statistics.fmean(rewards["sync"][half:]), statistics.fmean(rewards["off_policy"][half:])]


def _update_slowdown() -> list[float]:
    """The off-policy arm's median update over the synchronous arm's, and the synchronous arm's median
    step over the off-policy arm's."""
    arms = summary()["arms"]
    return [arms["off_policy"]["median"]["update_s"] / arms["sync"]["median"]["update_s"], summary()["ratio_median"],
            summary()["ratio_median_after_first"]]


OFF_POLICY_QUOTES = [
    Quote(BENCH_MD, "with nothing else running (load average {} before, {} after:", lambda: [
        summary()["load_before"][0], summary()["load_after"][0]], SOURCE, SECTION),
    Quote(BENCH_MD, f"| {ARMS[0][1]} | {{}} s | {{}} s | {{}} s | {{}} s | - | - | {{}} min |",
          lambda: _arm_row("sync"), SOURCE, SECTION),
    Quote(BENCH_MD, f"| {ARMS[1][1]} | {{}} s | {{}} s | {{}} s | {{}} s | {{}} s | {{}} s | {{}} min |",
          lambda: _arm_row("off_policy"), SOURCE, SECTION),
    Quote(BENCH_MD, "the update beside the thread took {}x as long as alone, so the synchronous arm's median step "
                    "was {}x the off-policy arm's ({}x after step 0)", _update_slowdown, SOURCE, SECTION),
    Quote(BENCH_MD, "and the thread's generation and corrections took about {}x the synchronous arm's",
          lambda: [_arm_row("off_policy")[2] / _arm_row("sync")[2]], SOURCE, SECTION),
    Quote(BENCH_MD, "mean training reward over the 16 steps was {} synchronous and {} off-policy, over the last 8 {} "
                    "and {}", _means, SOURCE, SECTION),
    Quote(ROLLOUTS_MD, "took about {}x as long as synchronously on 2 cores, the update beside the generation {}x "
                       "slower than alone", lambda: [summary()["arms"]["off_policy"]["total_wall_s"]
                                                     / summary()["arms"]["sync"]["total_wall_s"], _update_slowdown()[0]],
          SOURCE, "One step off-policy"),
    *[Quote(BENCH_MD, f"| {i} | {{}} | {{}} | {{}} | {{}} | {{}} | {{}} |", lambda i=i: _step_row(i), SOURCE, SECTION)
      for i in range(16)],
]


def _first(arm: str, run: str, n: int = 4) -> list[float]:
    """Medians over a run's first ``n`` steps: the step, generation + corrections, the update."""
    rows = steps(arm, run)[:n]
    return [statistics.median(r[k] for r in rows) for k in ("wall_s",)] + [
        statistics.median(r["generate_s"] + r["correct_s"] for r in rows), statistics.median(r["update_s"] for r in rows)]


def _passive_row(arm: str) -> list[float]:
    """The 4-step run's median step, after step 0, generation + corrections and update; then the
    16-step run's first 4 steps' step, generation + corrections and update."""
    s = summary(PASSIVE)["arms"][arm]
    own = _first(arm, PASSIVE)
    return [own[0], s["median_after_first"]["wall_s"], own[1], own[2], *_first(arm, RUN)]


def _passive_ratios() -> list[float]:
    """Off-policy over synchronous: the 16-step run's first 4 steps, then the 4-step run's median
    step (and after step 0); the updates and the generations + corrections, 4-step run first."""
    sync, off = _passive_row("sync"), _passive_row("off_policy")
    return [off[4] / sync[4], off[0] / sync[0], off[1] / sync[1], off[3] / sync[3], off[6] / sync[6],
            off[2] / sync[2], off[5] / sync[5]]


def _same_first_steps() -> list[bool]:
    """Which of the first 4 synchronous steps the two runs share exactly (reward and mean length)."""
    return [(a["reward"], a["response_len"]) == (b["reward"], b["response_len"])
            for a, b in zip(steps("sync", PASSIVE), steps("sync", RUN))]


OFF_POLICY_QUOTES += [
    Quote(BENCH_MD, "with nothing else running (load average {} before, {} after); `results/bench_off_policy/steps4_passive/`",
          lambda: [summary(PASSIVE)["load_before"][0], summary(PASSIVE)["load_after"][0]], PASSIVE_SOURCE,
          PASSIVE_SECTION),
    Quote(BENCH_MD, "| synchronous | {} s | {} s | {} s | {} s | {} s | {} s | {} s |", lambda: _passive_row("sync"),
          PASSIVE_SOURCE, PASSIVE_SECTION),
    Quote(BENCH_MD, "| one step off-policy | {} s | {} s | {} s | {} s | {} s | {} s | {} s |",
          lambda: _passive_row("off_policy"), PASSIVE_SOURCE, PASSIVE_SECTION),
    Quote(BENCH_MD, "went from {}x the synchronous arm's (the 16-step run's first 4 steps) to {}x ({}x after step 0): "
                    "the update beside the thread took {}x as long as alone instead of {}x, the thread's generation "
                    "and corrections {}x the synchronous arm's instead of {}x.", _passive_ratios, PASSIVE_SOURCE,
          PASSIVE_SECTION),
    Quote(BENCH_MD, "and differed from step 3 on (reward {} against {})",
          lambda: [steps("sync", PASSIVE)[3]["reward"], steps("sync", RUN)[3]["reward"]], PASSIVE_SOURCE,
          PASSIVE_SECTION),
]

OFF_POLICY_QUOTES.append(Quote(ROLLOUTS_MD, "(set before they start), {} steps took {}x as long as synchronously",
                               lambda: [summary(PASSIVE)["steps"], summary(PASSIVE)["arms"]["off_policy"]["total_wall_s"]
                                        / summary(PASSIVE)["arms"]["sync"]["total_wall_s"]],
                               PASSIVE_SOURCE, "One step off-policy"))

OFF_POLICY_CLAIMS = [
    Claim(BENCH_MD, "The synchronous arm repeated the 16-step run's steps 0-2 exactly", lambda: _same_first_steps()
          == [True, True, True, False], PASSIVE_SOURCE, PASSIVE_SECTION),
    Claim(BENCH_MD, "One change from the 16-step run: `OMP_WAIT_POLICY=PASSIVE`", lambda: summary(PASSIVE)["openmp"]
          == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": None, "VLLM_CPU_OMP_THREADS_BIND": None}
          and "openmp" not in summary(RUN) and summary(PASSIVE)["config"] == summary(RUN)["config"]
          and summary(PASSIVE)["seed"] == summary(RUN)["seed"], PASSIVE_SOURCE, PASSIVE_SECTION),
]
