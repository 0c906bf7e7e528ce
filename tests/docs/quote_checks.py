"""How tests/docs/test_quoted_numbers.py finds a quoted number on a page and compares it with its
data: ``Quote`` (a fragment of the page with ``{}`` for each number), ``Claim`` (a fragment whose
statement is checked instead of a number), ``mismatches`` and ``unchecked_numbers``."""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[2]
README, RESULTS_MD, BENCH_MD = "README.md", "docs/results.md", "docs/benchmarks.md"
NUMBER = r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?"


@dataclass(frozen=True)
class Quote:
    """``anchor``: the page's text with ``{}`` for each number; ``values``: those numbers,
    recomputed; ``source``: the file(s) they come from; ``section``: a heading whose section
    the anchor lies in (the whole page when empty)."""

    page: str
    anchor: str
    values: Callable[[], Sequence[float]]
    source: str
    section: str = ""


@dataclass(frozen=True)
class Claim:
    """A statement with no number to compare: the fragment must be on the page and ``holds``
    true of the data."""

    page: str
    anchor: str
    holds: Callable[[], bool]
    source: str
    section: str = ""


def _pattern(anchor: str) -> re.Pattern:
    parts = [re.escape(p) for p in anchor.split("{}")]
    parts = [re.sub(r"(\\ |\\\n|\s)+", r"\\s+", p) for p in parts]
    return re.compile(f"({NUMBER})".join(parts))


def section_of(text: str, heading: str) -> tuple[int, int]:
    """The span of the section under the heading line that starts with ``heading`` (up to the
    next heading of the same or a higher level); the whole text for ''."""
    if not heading:
        return 0, len(text)
    fences = [m.span() for m in re.finditer(r"^```.*?^```", text, re.M | re.S)]  # a `# comment` there is no heading
    headings = [m for m in re.finditer(r"^(#+) (.*)$", text, re.M)
                if not any(a <= m.start() < b for a, b in fences)]
    start = next((m for m in headings if m.group(2).startswith(heading)), None)
    assert start, f"heading {heading!r} not found"
    level = len(start.group(1))
    end = next((m.start() for m in headings if m.start() > start.start() and len(m.group(1)) <= level), len(text))
    return start.start(), end


@cache
def page(name: str) -> str:
    """The text of ``name``, a path from the repository's root."""
    return (REPO / name).read_text()


def find(check, text: str) -> re.Match:
    """Where ``check``'s fragment is in ``text`` (its section): exactly once, or it fails saying so."""
    lo, hi = section_of(text, check.section)
    found = list(_pattern(check.anchor).finditer(text, lo, hi))
    where = f"{check.page}" + (f", section {check.section!r}" if check.section else "")
    assert found, f"{where}: the fragment {check.anchor!r} is not on the page (reworded? update it in tests/docs/quotes_*.py)"
    assert len(found) == 1, f"{where}: the fragment {check.anchor!r} is there {len(found)} times; make it unique"
    return found[0]


def decimals(printed: str) -> int:
    return len(printed.split(".")[1]) if "." in printed else 0


def mismatches(check, text: str) -> list[str]:
    """What the page prints that its data does not give, one line per number."""
    m = find(check, text)
    printed = m.groups()
    values = list(check.values())
    assert len(values) == len(printed), f"{check.anchor!r}: {len(printed)} numbers on the page, {len(values)} computed"
    out = []
    for shown, value in zip(printed, values):
        tolerance = 0.5 * 10 ** -decimals(shown) * (1 + 1e-9) + 1e-12
        if not abs(float(shown.replace(",", "")) - value) <= tolerance:
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{check.page}:{line}: {shown} in {m.group(0)!r} is {value:.6g} in {check.source}")
    return out


# A number as a reader sees one: not part of a word (SmolLM2, 135M), optionally a ratio ("4x").
TOKEN = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?:e\d+)?(?=x\b|[^\w]|$)")


def unchecked_numbers(name: str, text: str, block: tuple[int, int], checks: Sequence,
                      definitions: Sequence[str] = ()) -> list[str]:
    """The numbers in ``block`` of page ``name``'s ``text`` that no check's fragment, no listed
    definition, inline code span or link target holds, each with its line."""
    covered = [find(c, text).span() for c in checks if c.page == name]
    covered += [m.span() for d in definitions for m in re.finditer(re.escape(d), text)]
    covered += [m.span() for m in re.finditer(r"`[^`\n]+`|\]\([^)\s]+\)", text)]
    lo, hi = block
    out = []
    for m in TOKEN.finditer(text, lo, hi):
        if not any(a <= m.start() and m.end() <= b for a, b in covered):
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{name}:{line}: {m.group(0)} in {text.splitlines()[line - 1].strip()!r}")
    return out
