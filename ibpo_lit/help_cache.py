"""``python -m ibpo_lit [fit|validate] --help`` in a fraction of a second, after its first time.

Why a cache and not only lazy imports: ``fit --help`` documents every field of Lightning's
Trainer and of ibpo-lit's classes, read from their signatures, so Lightning must be imported,
and importing Lightning takes 3.5-5 s on a 2-core CPU (it imports torchmetrics, which imports
transformers and, where installed, scipy and matplotlib). No import inside ibpo-lit can remove
that. The text changes only when the code or the installed packages change, so the first call
renders it and keeps it; later calls print the kept copy without importing torch.

The key of a kept text: the command as typed and its exact arguments, the terminal width (argparse wraps to it), the
Python version, the versions of the packages the text is rendered from (ibpo-lit, Lightning,
jsonargparse, torch, transformers, docstring-parser) and the size and modification time of
every source file of ``ibpo_lit/`` and ``callbacks/`` (an edited checkout renders anew).

What is covered: ``--help`` or ``-h`` alone, or after ``fit`` or ``validate``. What is not:
help with other arguments (``fit --config C --help`` shows C's values as defaults: rendered
every time), and the ``evaluate``/``export``/``fetch``/``plan`` subcommands (their own parsers).
One text is kept per request (a newer key replaces it). A cache folder that cannot be written
only costs the speed. ``fit`` keeps the help of the parser it builds anyway (`ibpo_lit.cli`), so
after the quick start's first run even the first ``--help`` is fast.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Optional

from ibpo_lit.cache_dir import default_cache_dir

HELP_FLAGS = ("-h", "--help")
SUBCOMMANDS = ("fit", "validate")
PACKAGES = ("ibpo-lit", "lightning", "jsonargparse", "torch", "transformers", "docstring-parser")
SOURCES = (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent / "callbacks")


def is_plain_help(argv: list[str]) -> bool:
    """``[--help]``, ``[-h]``, or one of `SUBCOMMANDS` followed by one of them."""
    return (len(argv) == 1 and argv[0] in HELP_FLAGS) or (
        len(argv) == 2 and argv[0] in SUBCOMMANDS and argv[1] in HELP_FLAGS)


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "-"


def _sources_stamp() -> str:
    stamp = hashlib.sha256()
    for root in SOURCES:
        for path in sorted(root.rglob("*.py")):
            info = path.stat()
            stamp.update(f"{path}:{info.st_size}:{info.st_mtime_ns};".encode())
    return stamp.hexdigest()


def help_path(argv: list[str]) -> Path:
    """Where the help of ``argv`` is kept (the file name is the key)."""
    key = "|".join([
        os.path.basename(sys.argv[0]), " ".join(argv),  # the usage line names the command as typed
        str(shutil.get_terminal_size().columns), sys.version,
        *(f"{name}={_version(name)}" for name in PACKAGES), _sources_stamp(),
    ])
    return default_cache_dir() / "help" / f"{_slug(argv)}-{hashlib.sha256(key.encode()).hexdigest()[:32]}.txt"


def _slug(argv: list[str]) -> str:
    return "-".join(a.lstrip("-") for a in argv)


def kept_help(argv: list[str]) -> Optional[str]:
    """The kept help of ``argv``; None when there is none (or ``argv`` is not a plain help request)."""
    if not is_plain_help(argv):
        return None
    try:
        return help_path(argv).read_text(encoding="utf-8")
    except OSError:
        return None


def keep_help(argv: list[str], text: str) -> None:
    """Keep ``text`` as the help of ``argv`` (written whole or not at all)."""
    if not is_plain_help(argv) or not text:
        return
    path = help_path(argv)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        # One text per request: an edited checkout or a new package leaves its old one behind.
        for old in path.parent.glob(f"{_slug(argv)}-*.txt"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        pass
