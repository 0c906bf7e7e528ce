"""Shared memory that a killed run of vLLM's CPU build leaves behind, removed before the next.

vLLM's CPU build moves tensor-parallel collectives through POSIX shared memory named after the
group only (``/dev/shm/-tp:0-[0-1]-cpushm_<rank>`` under ``external_launcher``: the same name in
every run). A run that ends normally removes its segments; one killed with SIGKILL (a
scheduler's pre-emption, an out-of-memory kill) cannot, and the next run's engine, a resume
included, then fails to start: ``create shm in SHMManager failed. errno: 17`` (the name exists).

`remove_stale_segments` deletes those segments that no live process has mapped. The engine
calls it on each node's local rank 0, and every rank of the run waits for that before creating
its own, so none of this run's segments can be caught half made. (No age limit: a resume
right after the kill is the case this is for.)

What is not covered: two tensor-parallel runs at once on one machine share the names
(vLLM's naming), so one starting while another creates its segments can still fail; run them
one after the other, or on other machines. GPUs do not use these segments.
"""
from __future__ import annotations

import glob
import os

SHM_DIR = "/dev/shm"
PATTERN = "*-cpushm_*"


def _mapped_paths(candidates: set[str]) -> set[str]:
    """Which of ``candidates`` some process maps (its ``/proc/<pid>/maps``; others' unreadable
    maps are processes of other users, whose segments we could not remove anyway)."""
    found: set[str] = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        found.update(path for path in candidates if path in text)
        if found == candidates:
            break
    return found


def remove_stale_segments(directory: str = SHM_DIR) -> list[str]:
    """Remove the vLLM CPU tensor-parallel segments in ``directory`` that no process maps;
    returns the removed paths."""
    candidates = set(glob.glob(os.path.join(glob.escape(directory), PATTERN)))
    if not candidates:
        return []
    removed = []
    for path in sorted(candidates - _mapped_paths(candidates)):
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed
