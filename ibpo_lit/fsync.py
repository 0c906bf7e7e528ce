"""Making a rename durable: ``fsync`` of the directory that holds it.

Used by the single-file checkpoint writer (`ibpo_lit.training.checkpoint_io`) and by the sharded
checkpoint's publish step (`ibpo_lit.scale.strategy`); it lives below both rooms so that neither
imports the other (the strategy imported it from training/, an arrow back up).
"""
from __future__ import annotations

import os


def fsync_dir(directory: str) -> None:
    """``fsync`` ``directory`` so a rename inside it survives a power cut (a no-op where the
    platform cannot open or sync a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
