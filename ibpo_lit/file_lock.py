"""One exclusive lock for every place that processes must take turns: the SmolLM2 cache
(``models/smollm2.py``) and a comparison's ``summary.json`` (``experiments/summary_store.py``);
and a claim that does not wait, for work another process may already be doing (a comparison's
run, ``scripts/compare.py``).

The lock is `filelock`'s (a kept library, already a dependency of huggingface_hub); this module
adds only the word to the log while another process holds it, which a user waiting on a
download in another terminal needs to see.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator, Union

from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive_lock(path: Union[str, os.PathLike]) -> Iterator[None]:
    """Exclusive lock on the lock file ``path`` (created if missing). Waits, saying so, while
    another process holds it; released when the block ends, and by the kernel if the process dies."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"exclusive_lock takes a lock file's path, not a folder: {path}")
    lock = FileLock(os.fspath(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.warning("waiting for another process that holds %s", path)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def claim(path: Union[str, os.PathLike]) -> Iterator[bool]:
    """The lock on ``path`` if no other process holds it: yields True, held until the block
    ends (or the process dies); False at once when another process holds it."""
    lock = FileLock(os.fspath(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
