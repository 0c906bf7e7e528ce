"""``python -m ibpo_lit fetch [smollm2-135m-instruct] [--cache-dir DIR] [--force]``.

Fetches and converts a fetched built-in model ahead of a run (for example before going
offline) and prints its directory, which ``model.model`` also accepts.
"""
from __future__ import annotations

import argparse
import sys

from ibpo_lit.models.smollm2 import SMOLLM2_NAME, default_cache_dir, fetch_smollm2

FETCHERS = {SMOLLM2_NAME: fetch_smollm2}


def fetch_main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line after ``fetch``), fetch, print the directory.

    Returns the exit status: 0 on success, 1 when the download or conversion failed (the
    reason goes to stderr).
    """
    parser = argparse.ArgumentParser(
        prog="python -m ibpo_lit fetch",
        description="Download and convert a built-in pretrained model into the local cache; "
        "print its directory.",
    )
    parser.add_argument("name", nargs="?", default=SMOLLM2_NAME, choices=sorted(FETCHERS))
    parser.add_argument(
        "--cache-dir",
        default=None,
        help=f"cache root (default: $IBPO_LIT_CACHE or ~/.cache/ibpo_lit; now {default_cache_dir()})",
    )
    parser.add_argument("--force", action="store_true", help="convert again even if cached")
    if argv is None:
        argv = sys.argv[1:]
        argv = argv[1:] if argv[:1] == ["fetch"] else argv
    args = parser.parse_args(argv)
    try:
        path = FETCHERS[args.name](cache_dir=args.cache_dir, force=args.force)
    except (RuntimeError, ImportError, OSError) as exc:
        print(f"fetch {args.name} failed: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(fetch_main(sys.argv[1:]))
