"""Parses of policy output before and after issue 43 (item 4): time on worst-case inputs of size
n and 8n, and the growth (linear ~8x, quadratic ~64x).

    python scripts/bench_bounded_parsing.py --out results/bounded_parsing/growth.json

Each row is one parse the trainer runs on a response, on an input built to trigger its worst
case: ``before`` is the code issue 43 replaced (the fence regex of ``extract_code``, CIW's
arithmetic pattern, ``token_pieces`` without its pending-token cap), ``after`` what runs now.
Times are the best of ``--repeats`` single calls (seconds). The test that guards the growth is
tests/rewards/test_bounded_parsing.py; this script records the figures docs/rewards.md quotes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ibpo_lit.training.ciw_scorer as ciw_scorer  # noqa: E402
from ibpo_lit.algorithms.ciw import CIWConfig, detect_spans  # noqa: E402
from ibpo_lit.rewards.code import extract_code  # noqa: E402

OLD_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_NUMBER = r"\$?\d+(?:,\d{3})*(?:\.\d+)?"
_OPERATOR = r"(?:[-+*/×÷·x]|\\times|\\cdot|\\div)"
OLD_ARITHMETIC = rf"{_NUMBER}(?:\s*{_OPERATOR}\s*{_NUMBER})+\s*=\s*-?{_NUMBER}"


class ByteTokenizer:
    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        return bytes(ids).decode("utf-8", "replace")


def _pieces(ids, cap):
    saved, ciw_scorer.MAX_PENDING_TOKENS = ciw_scorer.MAX_PENDING_TOKENS, cap
    try:
        return ciw_scorer.token_pieces(ByteTokenizer(), ids)
    finally:
        ciw_scorer.MAX_PENDING_TOKENS = saved


def _old_extract(text):
    return [m.group(2) for m in OLD_FENCE.finditer(text)]


OLD_CIW, NEW_CIW = CIWConfig(arithmetic_pattern=OLD_ARITHMETIC), CIWConfig()
CASES = [  # (parse, input, n, make, before, after)
    ("extract_code", "a fence, then one long line", 2_000, lambda n: "```" + "a" * n, _old_extract, extract_code),
    ("extract_code", "a run of backticks", 2_000, lambda n: "`" * n, _old_extract, extract_code),
    ("CIW arithmetic spans", "a chain of operations with no result", 1_000, lambda n: "1+" * (n // 2),
     lambda t: detect_spans(list(t), OLD_CIW), lambda t: detect_spans(list(t), NEW_CIW)),
    ("CIW arithmetic spans", "one long number", 1_000, lambda n: "7" * n,
     lambda t: detect_spans(list(t), OLD_CIW), lambda t: detect_spans(list(t), NEW_CIW)),
    ("CIW token_pieces", "byte tokens that never complete a character", 2_000, lambda n: [0xE2, 0x82] * (n // 2),
     lambda ids: _pieces(ids, 10**9), lambda ids: _pieces(ids, ciw_scorer.MAX_PENDING_TOKENS)),
]


def best(fn, arg, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for parse, case, n, make, before, after in CASES:
        row = {"parse": parse, "input": case, "n": n}
        for arm, fn in (("before", before), ("after", after)):
            small, big = best(fn, make(n), args.repeats), best(fn, make(8 * n), args.repeats)
            row[arm] = {"seconds_n": small, "seconds_8n": big, "growth": big / small}
        rows.append(row)
        print(f"{parse:22} {case:45} n={n:6}  before {row['before']['seconds_8n'] * 1e3:9.3f} ms at 8n, "
              f"x{row['before']['growth']:5.1f};  after {row['after']['seconds_8n'] * 1e3:9.3f} ms, "
              f"x{row['after']['growth']:5.1f}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                  f"Python {platform.python_version()}", "load_average": os.getloadavg(), "rows": rows}
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
