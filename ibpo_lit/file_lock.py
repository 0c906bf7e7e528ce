"""One exclusive ``flock`` helper for every place that processes must take turns: the SmolLM2
cache (``models/smollm2.py``) and a comparison's ``summary.json`` (``experiments/summary_store.py``)."""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from typing import Iterator, Union

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive_lock(path: Union[str, os.PathLike]) -> Iterator[None]:
    """Exclusive advisory lock on ``path``: a lock file (created if missing) or a folder itself
    (so no lock file has to live in it). Waits, saying so, while another process holds it;
    released when the block ends, and by the kernel if the process dies."""
    fd = os.open(path, os.O_RDONLY) if os.path.isdir(path) else os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning("waiting for another process that holds %s", path)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
