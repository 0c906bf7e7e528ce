"""Atomic checkpoint files: a run killed while saving keeps its previous checkpoint.

`AtomicCheckpointIO` is Lightning's `TorchCheckpointIO` with one change, how the file is
written: to a temporary file in the checkpoint's own directory, flushed and ``fsync``-ed, then
renamed over the target with `os.replace` (atomic on POSIX within one file system), and the
directory ``fsync``-ed so the rename itself survives a power cut. At every instant the target
path holds either the complete old file or the complete new one. The CLI installs it unless
``trainer.plugins`` names another `CheckpointIO`.

Why not Lightning's own writer: it serialises to memory and writes through an fsspec
transaction, whose temporary file on a local file system lives in the system temp directory;
committing then moves it across file systems (a copy, not an atomic rename) whenever the
checkpoint directory is not on the same device as ``/tmp``, and nothing is ``fsync``-ed.

What is covered:
- local paths; a SIGKILL at any point leaves ``<target>`` intact and at most one stray
  ``.<target name>.*.tmp`` beside it, removed by the next save of the same target;
- loading and removal are `TorchCheckpointIO`'s.

What is not covered:
- remote URLs (``s3://``, ...): delegated to `TorchCheckpointIO` unchanged;
- sharded (directory) checkpoints of FSDP's ``state_dict_type="sharded"``: the strategy writes
  those itself, without this class.
"""
from __future__ import annotations

import glob
import os
import tempfile
from typing import Any, Optional

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ibpo_lit.fsync import fsync_dir


def _temp_prefix(path: str) -> str:
    return f".{os.path.basename(path)}."


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` such that ``path`` is never seen half written."""
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    # Leftovers of a save that was killed; only this process writes this target.
    for stale in glob.glob(os.path.join(glob.escape(directory), glob.escape(_temp_prefix(path)) + "*.tmp")):
        try:
            os.remove(stale)
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose local writes are atomic (see the module docstring)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        atomic_torch_save(checkpoint, path)


def run_state(ckpt_path: Optional[str]) -> dict:
    """The ``ibpo_lit`` entry of a checkpoint (`IBPOModule.on_save_checkpoint`) without reading
    its weights: a file is memory-mapped, a sharded checkpoint's ``meta.pt`` holds it. ``{}`` for
    a keyword (``last``), a missing or unreadable path (the config checks report those)."""
    if not ckpt_path or not os.path.exists(ckpt_path):
        return {}
    path = os.path.join(ckpt_path, "meta.pt") if os.path.isdir(ckpt_path) else ckpt_path
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=not os.path.isdir(ckpt_path))
    except Exception:  # noqa: BLE001 - a damaged checkpoint is reported where it is loaded
        return {}
    state = checkpoint.get("ibpo_lit", {}) if isinstance(checkpoint, dict) else {}
    return state if isinstance(state, dict) else {}
