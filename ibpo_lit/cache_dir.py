"""Where ibpo-lit keeps what it fetches or derives between runs (models, help text).

A module of its own, with nothing heavy imported, so the command line can find the cache
before it imports torch or Lightning.
"""
from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$IBPO_LIT_CACHE`` if set, else ``~/.cache/ibpo_lit``."""
    env = os.environ.get("IBPO_LIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ibpo_lit"
