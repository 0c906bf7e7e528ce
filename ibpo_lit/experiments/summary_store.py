"""A comparison's ``summary.json``, shared safely between ``scripts/compare.py`` processes.

Two comparisons may write one output folder at once (say the lambda sweep and the alpha sweep
on two machines with a shared disk, or two streams on one): each run's summary is merged into
the file under a lock, never written from a process's own stale copy, which would drop the
other's runs. The lock is ``summary.json.lock`` beside the file (``file_lock``), which git ignores.
"""
from __future__ import annotations

import json
import os

from ibpo_lit.file_lock import exclusive_lock


def load_summaries(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def record_summary(path: str, summary: dict) -> list[dict]:
    """Add ``summary`` to the file at ``path`` (replacing an earlier one of the same arm and
    seed, in place), re-reading the file under the lock; returns the merged list."""
    with exclusive_lock(os.path.abspath(path) + ".lock"):
        summaries = load_summaries(path)
        key = (summary["arm"], summary["seed"])
        at = next((i for i, s in enumerate(summaries) if (s["arm"], s["seed"]) == key), None)
        if at is None:
            summaries.append(summary)
        else:
            summaries[at] = summary
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(summaries, f, indent=1)
        os.replace(tmp, path)  # readers never see a half-written file
    return summaries
