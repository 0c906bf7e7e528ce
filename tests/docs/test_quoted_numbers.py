"""Every number README.md and docs/results.md quote from results/, recomputed from the per-run
files there; a number that drifts from its data fails, naming the page, the number and the file.

The quotes are in ``quotes_readme.py`` (README.md, and docs/benchmarks.md's table of the runs
behind README's speed medians), ``quotes_off_policy.py`` (docs/benchmarks.md's 16-step off-policy
run) and ``quotes_results.py`` (docs/results.md); the recomputations
in ``results_files.py``; the matching in ``quote_checks.py``. A ``Quote`` is an exact fragment
of its page with ``{}`` where each number stands; a space in it matches any run of spaces and
line breaks, so rewrapping a paragraph keeps it, while rewording that fragment fails and names
it. It must appear exactly once in its section. Each number is compared at the precision it is
printed with (``0.046`` must lie within 0.0005 of the recomputed value, ``-25`` within 0.5). A
``Claim`` is a fragment whose statement is checked instead of a number ("which excludes 0",
"the same last checkpoints").

Where the numbers come from: the per-run files, never a rendering of them (``compare.md``,
``summary.md``, ``report.md``, ``table.md``, the variance ``.md`` tables):
- a comparison's ``results/<comparison>/summary.json`` (one record per run), through the
  interval code that made the pages (``evaluation.bootstrap``, ``experiments.cells`` and
  ``experiments.tables``); docs/results.md's generated block is rendered again from all of them
  with ``scripts/report.py``'s functions and must equal the page's, cell for cell;
- ``results/variance/*.json`` (each method's statistics, as ``--report`` recomputed them from
  the saved inner products), ``results/exact_gradient/{fixed,curves}.json``,
  ``results/correction_regime/*.json`` (per-problem samples), ``results/bench_throughput/**.json``
  (per-arm rows), ``results/bench_sandbox/sandbox.json``, ``results/quickstart_precision/*.log``,
  ``results/bench_off_policy/steps16/`` (summary.json and each arm's steps.jsonl).

Strict blocks: in README's Results section and speed bullet, and in docs/results.md's summary
("What is known, what is not, and why"), every number must lie inside a checked fragment or a
listed definition: a number added there without a check fails, with its line.

What is not covered: the rest of docs/results.md and docs/benchmarks.md outside their checked
fragments (the method descriptions, commands and configuration values are definitions, not
measurements); pages other than README.md, docs/results.md and docs/benchmarks.md; dates, which no result file
records (they are the dates of the commits that added the files). No training and no model: JSON
and logs only, all inside the repository.
"""
from __future__ import annotations

import re

import pytest

from quote_checks import README, RESULTS_MD, find, mismatches, page, section_of, unchecked_numbers
from quotes_off_policy import OFF_POLICY_CLAIMS, OFF_POLICY_QUOTES
from quotes_readme import BENCH_CLAIMS, BENCH_QUOTES, README_CLAIMS, README_QUOTES
from quotes_results import RESULTS_SECTION_CLAIMS, RESULTS_SECTION_QUOTES, RESULTS_SUMMARY_CLAIMS, RESULTS_SUMMARY_QUOTES
from results_files import KNOWN, REPO, S_P2, SPEED_RUNS, generated_block, rendered_report, speed_files

QUOTES = README_QUOTES + BENCH_QUOTES + OFF_POLICY_QUOTES + RESULTS_SUMMARY_QUOTES + RESULTS_SECTION_QUOTES
CLAIMS = README_CLAIMS + BENCH_CLAIMS + OFF_POLICY_CLAIMS + RESULTS_SUMMARY_CLAIMS + RESULTS_SECTION_CLAIMS


def _id(check) -> str:
    return f"{check.page}: {check.anchor[:60]}"


@pytest.mark.parametrize("quote", QUOTES, ids=_id)
def test_quoted_number_is_its_file(quote):
    found = mismatches(quote, page(quote.page))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("claim", CLAIMS, ids=_id)
def test_claim_holds_for_its_file(claim):
    find(claim, page(claim.page))
    assert claim.holds(), f"{claim.page}: {claim.anchor!r} does not hold for {claim.source}"


def test_results_generated_block_is_the_summaries_rendered_again(monkeypatch):
    """No table cell of docs/results.md's generated block may drift from its runs."""
    monkeypatch.chdir(REPO)  # the tables name each comparison by its folder, relative to the repository
    assert generated_block(page(RESULTS_MD)) == rendered_report(), (
        "docs/results.md's generated block differs from the runs in results/*/summary.json: "
        "run `python scripts/report.py --doc`")


def test_readme_speed_bullet_names_every_run_it_takes_the_median_of():
    text = page(README)
    bullet = text[text.index("- **Faster on the CPU"):text.index("What it is not (yet)")]
    named = set(re.findall(r"`([\w/.]+\.json)`", bullet))
    assert named == speed_files(), (f"README's speed bullet names {sorted(named)}, but its medians take "
                                    f"{sorted(speed_files())} (results/bench_throughput/)")


def test_benchmarks_speed_table_holds_every_run_the_medians_take():
    assert {path for path, _, _ in SPEED_RUNS} == speed_files(), (
        f"docs/benchmarks.md's speed table lists {sorted(p for p, _, _ in SPEED_RUNS)}; the medians take "
        f"{sorted(speed_files())}: add the new run's row (file, date, peak) there and to SPEED_RUNS")


# ----------------------------------------------------------------------------------- strict blocks
# Fragments of the strict blocks whose numbers are definitions, not measurements.
DEFINITIONS = {README: ["as the answer 3901"], RESULTS_MD: ["as the answer 3901"]}


def _readme_results(text: str) -> tuple[int, int]:
    return section_of(text, "Results")


def _readme_speed_bullet(text: str) -> tuple[int, int]:
    start = text.index("- **Faster on the CPU")
    return start, min(text.index("\n- ", start), text.index("\n\n", start))


STRICT_BLOCKS = [
    (README, "the Results section", _readme_results),
    (README, "the speed bullet", _readme_speed_bullet),
    (RESULTS_MD, f"the section {KNOWN!r}", lambda text: section_of(text, KNOWN)),
]


@pytest.mark.parametrize("name, label, block", STRICT_BLOCKS, ids=[f"{n}: {l}" for n, l, _ in STRICT_BLOCKS])
def test_every_number_in_a_strict_block_is_checked(name, label, block):
    text = page(name)
    missing = unchecked_numbers(name, text, block(text), QUOTES + CLAIMS, DEFINITIONS.get(name, []))
    assert not missing, (f"{name}, {label}: numbers no check holds (add a Quote for each to tests/docs/quotes_*.py, "
                         "recomputed from its file):\n" + "\n".join(missing))


# ------------------------------------------------------------------- the checks can fail (guards)
def test_a_number_changed_on_a_copy_of_the_page_fails_naming_page_number_and_file(tmp_path):
    """The README's main interval, one digit off in a temporary copy: the check names the page
    and line, the printed number, the recomputed one and the file."""
    quote = next(q for q in README_QUOTES if "sized for" in q.anchor)
    text = page(README)
    assert "-0.046 [-0.120, +0.029]" in text
    copy = tmp_path / "README.md"
    copy.write_text(text.replace("-0.046 [-0.120, +0.029]", "-0.046 [-0.130, +0.029]", 1))
    found = mismatches(quote, copy.read_text())
    assert len(found) == 1 and found[0].startswith("README.md:") and " -0.130 in " in found[0], found
    assert f"is -0.119929 in {S_P2}" in found[0], found
    assert not mismatches(quote, text)  # and the page as it is passes


def test_a_number_added_to_a_strict_block_without_a_check_fails():
    text = page(README)
    lo, hi = _readme_results(text)
    added = text[:hi] + "One more: 0.42 of them.\n" + text[hi:]
    found = unchecked_numbers(README, added, (lo, hi + 24), QUOTES + CLAIMS, DEFINITIONS[README])
    assert len(found) == 1 and "0.42" in found[0], found


def test_a_changed_cell_of_the_generated_block_fails(monkeypatch):
    monkeypatch.chdir(REPO)
    text = page(RESULTS_MD)
    row = "| k1 | results/compare_smollm2_strict | 3 | 0.458 [0.297, 0.620]"
    assert row in text
    changed = text.replace(row, row.replace("0.458", "0.459"), 1)
    assert generated_block(changed) != rendered_report() == generated_block(text)


def test_a_runs_final_eval_is_its_mean_over_the_problems():
    """``results_files.final_eval_diff`` relies on it to pair by problem without final_eval.py."""
    import numpy as np

    from results_files import POWER, POWER2, comparison

    for run in comparison(POWER) + comparison(POWER2):
        per_problem = np.asarray(run["final_eval_correct"]) / run["final_eval_k"]
        assert len(per_problem) == run["final_eval_problems"]
        assert abs(run["final_eval"] - per_problem.mean()) < 1e-6, (run["arm"], run["seed"])
