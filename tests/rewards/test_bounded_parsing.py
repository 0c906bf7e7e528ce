"""Issue 43, item 4: every parse the trainer runs on policy output is linear in the output's length.

Each test times one parse on an input of size n and on one of size 8n built to trigger its worst
case, in one run, and asserts the growth is well under quadratic: linear work grows ~8x, quadratic
~64x; the bound is 24x. Times are per call, the best of several repeats, the two sizes measured
in turn over windows of about the same length (the small input is parsed 8 times as often), so
that the shared machine's load falls on both alike; no absolute time is asserted.

Where the guard can be switched off (the regexes these parses replaced, the pending-token cap of
`token_pieces`), the same measurement is shown to fail with it off.

The table of every parse, and the ones bounded otherwise (a killable worker, a size the config
caps), is docs/rewards.md, "Bounded work on policy text".
"""
from __future__ import annotations

import math
import re
import time

import pytest

import ibpo_lit.rewards.code as code
import ibpo_lit.training.ciw_scorer as ciw_scorer
from ibpo_lit.algorithms.ciw import CIWConfig, detect_spans, find_answer_start, layout_response
from ibpo_lit.rewards.code import extract_code, fenced_blocks
from ibpo_lit.training.ciw_scorer import token_pieces

LINEAR_MAX = 24.0  # growth for 8x the input: linear ~8, quadratic ~64

# The patterns these parses used before issue 43, kept here only as the "guard off" examples.
OLD_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_NUMBER = r"\$?\d+(?:,\d{3})*(?:\.\d+)?"
_OPERATOR = r"(?:[-+*/×÷·x]|\\times|\\cdot|\\div)"
OLD_ARITHMETIC = rf"{_NUMBER}(?:\s*{_OPERATOR}\s*{_NUMBER})+\s*=\s*-?{_NUMBER}"


def _timed(fn, arg, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(arg)
    return time.perf_counter() - start


def growth(fn, make, n: int, repeats: int = 7, window_s: float = 0.02) -> float:
    """Time per call of ``fn(make(8 n))`` over time per call of ``fn(make(n))``."""
    small, big = make(n), make(8 * n)
    fn(small)
    once = _timed(fn, big, 1)
    calls = max(1, min(100, math.ceil(window_s / max(once, 1e-6))))  # of the big input per window
    best_small = best_big = math.inf
    for _ in range(repeats):
        best_small = min(best_small, _timed(fn, small, 8 * calls))
        best_big = min(best_big, _timed(fn, big, calls))
    return 8 * best_big / best_small


# ------------------------------------------------------------------ code extraction
FENCE_CASES = {
    "a fence, then one long line": lambda n: "```" + "a" * n,
    "a run of backticks": lambda n: "`" * n,
    "many fences on the last line": lambda n: "```a" * (n // 4),
    "a fence whose tag runs on": lambda n: "```" + "py" * (n // 2),
    "an unclosed block": lambda n: "```python\n" + "x = 1\n" * (n // 6),
    "many closed blocks": lambda n: "```py\nx\n```\n" * (n // 14),
}


@pytest.mark.parametrize("case", FENCE_CASES)
def test_code_extraction_is_linear(case):
    assert growth(extract_code, FENCE_CASES[case], 20_000) < LINEAR_MAX


def _old_blocks(text):
    return [(m.group(1).lower(), m.group(2)) for m in OLD_FENCE.finditer(text)]


def test_with_the_old_fence_pattern_code_extraction_is_quadratic(monkeypatch):
    monkeypatch.setattr(code, "fenced_blocks", _old_blocks)  # the guard off, inside extract_code
    for case in ("a fence, then one long line", "a run of backticks"):
        assert growth(extract_code, FENCE_CASES[case], 1_000, repeats=3) > LINEAR_MAX, case


def test_fenced_blocks_read_what_the_old_pattern_read():
    texts = ["```python\nx = 1\n```", "```py title=a\nx\n``` y ```\nz", "````\nq", "```a", "``` \tPY3+x\nb",
             "a\n```\n1\n```\n```python\n2\n", "```é²\nw\n```", "```\n```\n```\n", "no fence"]
    for text in texts:
        assert fenced_blocks(text) == _old_blocks(text), text
    assert extract_code("```\nplain\n```\n```python\nchosen\n```\n```\nlast plain\n```") == "chosen\n"


# ------------------------------------------------------------------ CIW: spans, markers, pieces
def _spans(cfg):
    return lambda text: detect_spans(list(text), cfg)  # a character-level tokenizer's pieces


SPAN_CASES = {
    "a chain of operations with no result": lambda n: "1+" * (n // 2),
    "a chain whose result is not a number": lambda n: "1 + " * (n // 4) + "1 = x",
    "one long number": lambda n: "7" * n,
    "thousands groups": lambda n: "1" + ",000" * (n // 4),
    "sentences and sums": lambda n: "So 12 + 30 = 42. " * (n // 17),
    "blank lines": lambda n: "\n" + " \t" * (n // 2),
}


@pytest.mark.parametrize("case", SPAN_CASES)
def test_ciw_span_detection_is_linear(case):
    assert growth(_spans(CIWConfig()), SPAN_CASES[case], 4_000) < LINEAR_MAX


def test_with_the_old_arithmetic_pattern_span_detection_is_quadratic():
    old = _spans(CIWConfig(arithmetic_pattern=OLD_ARITHMETIC))
    for case in ("a chain of operations with no result", "one long number"):
        assert growth(old, SPAN_CASES[case], 250, repeats=3) > LINEAR_MAX, case


def test_spans_are_those_of_the_old_pattern_on_ordinary_text():
    text = ("We buy 3 apples at $1.50: 3 * 1.50 = 4.50 dollars. Then 4.50 + 2 + 0.5 = 7 in all, "
            "and 1,200 - 200 = 1,000 left. 12 x 3 = 36, 5 \\times 2 = 10 and 1+1=2 end it.")
    old = re.compile(OLD_ARITHMETIC)
    new = re.compile(CIWConfig().arithmetic_pattern)
    assert [m.span() for m in old.finditer(text)] == [m.span() for m in new.finditer(text) if m.start("result") >= 0]
    spans = [text[s.start:s.end] for s in detect_spans(list(text), CIWConfig(max_span_tokens=100))
             if s.kind == "arithmetic"]
    assert spans == ["3 * 1.50 = 4.50", "4.50 + 2 + 0.5 = 7", "1,200 - 200 = 1,000", "12 x 3 = 36",
                     "5 \\times 2 = 10"]  # at most max_spans // 2 = 5: "1+1=2" is the 6th
    # A pattern without a group named "result" (the old one): every match is a span, as before.
    assert detect_spans(list(text), CIWConfig(arithmetic_pattern=OLD_ARITHMETIC, max_span_tokens=100)) \
        == detect_spans(list(text), CIWConfig(max_span_tokens=100))


MARKER_CASES = {
    "many markers, the last wins": (lambda n: "final answer " * (n // 13), CIWConfig(marker_occurrence="last")),
    "a run of hashes": (lambda n: "#" * n, CIWConfig(answer_markers=("final answer", "####"))),
}


@pytest.mark.parametrize("case", MARKER_CASES)
def test_ciw_answer_marker_search_is_linear(case):
    make, cfg = MARKER_CASES[case]
    assert growth(lambda text: find_answer_start(list(text), cfg), make, 8_000) < LINEAR_MAX


def test_a_whole_ciw_layout_is_linear():
    # The trainer's call: markers, arithmetic, sentences and formatting flags on one response.
    cfg = CIWConfig()
    assert growth(lambda text: layout_response(list(text), cfg), lambda n: "1+" * (n // 2) + " #### 5", 4_000) \
        < LINEAR_MAX


class ByteTokenizer:
    """One token per byte; decoding is UTF-8 with replacement characters, as a byte-level BPE
    tokenizer decodes bytes that are no text. Counts the tokens it decodes: token_pieces' work."""

    def __init__(self):
        self.decoded = 0

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        self.decoded += len(ids)
        return bytes(ids).decode("utf-8", "replace")


def decode_growth(n: int) -> float:
    """Tokens decoded for 8 n never-completing bytes over those for n: counted, not timed, since
    token_pieces' cost is its decodes and a count does not move with the machine's load (a timed
    version read 23.8x for a quadratic case on a loaded CI machine)."""
    work = []
    for size in (n, 8 * n):
        tok = ByteTokenizer()
        token_pieces(tok, _incomplete(size))
        work.append(tok.decoded)
    return work[1] / work[0]


def _incomplete(n):  # E2 82 never completes a character: the text always ends in U+FFFD
    return [0xE2, 0x82] * (n // 2)


def test_token_pieces_of_bytes_that_never_complete_are_linear():
    tok = ByteTokenizer()
    assert growth(lambda ids: token_pieces(tok, ids), _incomplete, 1_000) < LINEAR_MAX
    assert decode_growth(1_000) < 9


def test_without_the_pending_cap_token_pieces_are_quadratic(monkeypatch):
    monkeypatch.setattr(ciw_scorer, "MAX_PENDING_TOKENS", 10**9)  # the guard off
    assert decode_growth(500) > 50


def test_token_pieces_still_join_to_the_text():
    tok = ByteTokenizer()
    ids = list("ab €数学 x".encode()) * 3 + [0xE2, 0x82] * 40 + list(" ok €".encode())
    pieces = token_pieces(tok, ids)
    assert len(pieces) == len(ids) and "".join(pieces) == tok.decode(ids)
    assert pieces[:6] == ["a", "b", " ", "", "", "€"]  # a character split over 3 byte tokens
