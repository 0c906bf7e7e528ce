"""The numbers docs/benchmarks.md quotes from the 16-step run of scripts/bench_off_policy.py
(issue 44 item 5): each arm's medians, the ratio of the step times, and both arms' reward,
response length and wall time at every step, from the run's summary.json and its arms'
steps.jsonl (never its summary.md); and the two docs/rollouts.md takes from it."""
from __future__ import annotations

import json
import statistics
from functools import cache

from quote_checks import BENCH_MD, Quote

ROLLOUTS_MD = "docs/rollouts.md"
from results_files import RESULTS, result_json

RUN = "bench_off_policy/steps16"
SOURCE = f"results/{RUN}/summary.json, {{sync,off_policy}}/steps.jsonl"
SECTION = "16 steps, the quick start's length"  # its section of docs/benchmarks.md
ARMS = (("sync", "synchronous (`max_staleness: 0`)"), ("off_policy", "one step off-policy (`max_staleness: 1`)"))


@cache
def summary() -> dict:
    return result_json(f"{RUN}/summary.json")


@cache
def steps(arm: str) -> list[dict]:
    return [json.loads(line) for line in (RESULTS / RUN / arm / "steps.jsonl").read_text().splitlines()]


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
