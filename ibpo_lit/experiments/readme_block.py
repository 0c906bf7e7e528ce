"""Replacing a generated block of a markdown file (``docs/results.md``, written by
``scripts/report.py --doc``) between two marker lines, leaving everything outside them as it was."""
from __future__ import annotations

START = "<!-- report:start -->"
END = "<!-- report:end -->"


def replace_marked_block(text: str, block: str, start: str = START, end: str = END) -> str:
    """``text`` with whatever lies between ``start`` and ``end`` replaced by ``block``
    (the markers stay). Raises ``ValueError`` when a marker is missing, repeated or out of order."""
    counts = {marker: text.count(marker) for marker in (start, end)}
    missing = [marker for marker, n in counts.items() if n == 0]
    if missing:
        raise ValueError(f"{' and '.join(missing)} not found: put the two lines {start} and {end} where the report goes")
    repeated = [marker for marker, n in counts.items() if n > 1]
    if repeated:
        raise ValueError(f"marker {' and '.join(repeated)} appears more than once; keep one pair")
    i, j = text.index(start) + len(start), text.index(end)
    if j < i:
        raise ValueError(f"{end} comes before {start}")
    return f"{text[:i]}\n{block.strip()}\n{text[j:]}"
