"""Replacing the generated block of docs/results.md (scripts/report.py --doc) between its markers."""
import pytest

from ibpo_lit.experiments.readme_block import END, START, replace_marked_block


def test_only_the_text_between_the_markers_changes():
    text = f"# Title\n\nintro\n{START}\nold table\nold figure\n{END}\nafter\n"
    out = replace_marked_block(text, "new table\n")
    assert out == f"# Title\n\nintro\n{START}\nnew table\n{END}\nafter\n"
    assert replace_marked_block(out, "new table") == out  # idempotent


@pytest.mark.parametrize(
    "text, message",
    [
        ("no markers here", f"{START} and {END} not found: put the two lines"),
        (f"{START}\nonly the start", f"^{END} not found"),
        (f"{START}\n{END}\n{START}\n{END}", "appears more than once"),
        (f"{END}\n{START}", "comes before"),
    ],
)
def test_missing_repeated_or_swapped_markers_are_errors(text, message):
    with pytest.raises(ValueError, match=message):
        replace_marked_block(text, "table")
