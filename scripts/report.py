"""Tables and figures of finished comparisons, laid out like the IBPO and CIW papers'.

    python scripts/report.py                                   # every results/*/summary.json
    python scripts/report.py results/compare_smollm2 results/ablations --out /tmp/report
    python scripts/report.py --doc                             # also refresh docs/results.md's block
    python scripts/report.py --eval "GSPO G=32=results/eval/gspo_aime25.json" \\
        --eval "IBPO=results/eval/ibpo_aime25.json" --eval-metrics avg@k pass@k

Reads the ``summary.json`` of each comparison ``scripts/compare.py`` wrote (a file or its
folder; default: every ``results/*/summary.json``) and writes, under ``--out``, ``report.md``
and one PNG per table that has runs: baselines vs IBPO, the ablations (k = 1, shaping only),
the lambda and alpha sweeps, and CIW. Each cell is the mean and 95% t-interval over seeds;
each table has its arms' validation accuracy minus a reference arm's (paired t over the shared
seeds), and a paragraph says how many such comparisons the report holds (they are not
simultaneous); rows with fewer than 3 seeds are marked ``*(n=2)*``; arms not run yet are listed
as such.
``--eval LABEL=PATH`` adds benchmark tables from ``python -m ibpo_lit evaluate --combine ...
--output PATH`` (or a single run's ``--output``). ``--doc [PATH]`` (default ``docs/results.md``;
``--readme PATH`` is the old name, still accepted) replaces the text between
``<!-- report:start -->`` and ``<!-- report:end -->`` of that markdown file with the same
report, image paths made relative to the file's folder. The layout and arithmetic live in
``ibpo_lit/experiments/tables.py``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os

from ibpo_lit.experiments.readme_block import END, START, replace_marked_block
from ibpo_lit.experiments.report_plots import table_figure
from ibpo_lit.experiments.runs import read_comparison
from ibpo_lit.experiments.tables import REPORT_TABLES, as_combined, report_markdown

DEFAULT_GLOB = "results/*/summary.json"
DEFAULT_DOC = "docs/results.md"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("comparisons", nargs="*", help=f"summary.json files or their folders (default: {DEFAULT_GLOB})")
    p.add_argument("--out", default="results/report", help="folder for report.md and the PNGs")
    p.add_argument("--doc", "--readme", dest="doc", nargs="?", const=DEFAULT_DOC, default=None, metavar="PATH",
                   help=f"markdown file whose {START} ... {END} block is replaced (no PATH: {DEFAULT_DOC})")
    p.add_argument("--eval", action="append", default=[], metavar="LABEL=PATH",
                   help="a combined evaluation JSON under a row label (repeatable)")
    p.add_argument("--eval-metrics", nargs="+", default=["avg@k"], help="metrics of the evaluation tables")
    args = p.parse_args(argv)
    for spec in args.eval:
        if "=" not in spec:
            p.error(f"--eval takes LABEL=PATH, got {spec!r}")
    if args.doc and not args.doc.endswith(".md"):  # `--doc results/x`: a comparison taken for the PATH
        p.error(f"--doc takes a markdown file, got {args.doc!r}; put comparisons before --doc")
    return args


def load_summaries(paths: list[str], given: bool) -> list[dict]:
    """Every run of the comparisons at ``paths``. A file that is no comparison is an error when
    the user ``given`` it, and skipped when the default glob found it (e.g. a benchmark's)."""
    summaries = []
    for path in paths:
        try:
            summaries += read_comparison(path)
        except ValueError as e:
            if given:
                raise SystemExit(str(e)) from e
            print(f"[report] skipped: {e}")
    return summaries


def load_evals(specs: list[str]) -> list[tuple[str, dict]]:
    out = []
    for spec in specs:
        label, path = spec.rsplit("=", 1)  # the path is the part after the last '='
        with open(path) as f:
            try:
                out.append((label, as_combined(json.load(f))))
            except ValueError as e:
                raise SystemExit(f"{path}: {e}") from e
    return out


def main(argv=None) -> str:
    args = parse_args(argv)
    summaries = load_summaries(args.comparisons or sorted(glob.glob(DEFAULT_GLOB)), given=bool(args.comparisons))
    if not summaries:
        raise SystemExit(f"no comparison found under {DEFAULT_GLOB}: run scripts/compare.py or pass summary.json paths")
    evals = load_evals(args.eval)
    os.makedirs(args.out, exist_ok=True)
    drawn = [spec.name for spec in REPORT_TABLES
             if table_figure(spec, summaries, os.path.join(args.out, f"{spec.name}.png"))]
    report = report_markdown(summaries, {name: f"{name}.png" for name in drawn}, evals, args.eval_metrics)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report)
    if args.doc:
        # The document shows the same figures, addressed from its own folder.
        here = os.path.dirname(os.path.abspath(args.doc))
        images = {name: os.path.relpath(os.path.join(args.out, f"{name}.png"), here).replace(os.sep, "/")
                  for name in drawn}
        block = "<!-- generated by scripts/report.py: edit the script, not this block -->\n\n"
        block += report_markdown(summaries, images, evals, args.eval_metrics)
        with open(args.doc) as f:
            text = f.read()
        try:
            text = replace_marked_block(text, block)
        except ValueError as e:
            raise SystemExit(f"{args.doc}: {e}") from e
        with open(args.doc, "w") as f:
            f.write(text)
    print(report)
    print(f"[report] wrote {os.path.join(args.out, 'report.md')} and {len(drawn)} figure(s)"
          + (f"; updated {args.doc}" if args.doc else ""))
    return report


if __name__ == "__main__":
    main()
