"""Misbehaving rewards for the tests of `RewardPool`; registered only when this is imported.

Pool workers are separate interpreters that find a reward by name, so a test passes
``import_modules=["misbehaving_rewards"]`` to make these names exist there too (the workers get
the parent's ``sys.path``, where pytest put this folder).

- "sleep": sleeps 100 s (a hang that SIGALRM could interrupt).
- "busy_c": one long C-level loop (``sum(range(10**15))``) that holds the interpreter; a Python
  signal handler would not run until it ends, so only killing the process stops it.
- "raise": raises RuntimeError.
- "none": returns None.
- "heavy_imports": 1.0 if torch or lightning is loaded in the worker, else 0.0.
- "mixed": misbehaves as named when the completion is "SLEEP", "BUSY", "RAISE" or "NONE",
  otherwise scores like "math".
"""
from __future__ import annotations

import sys
import time

from ibpo_lit.rewards import REWARDS, math_score_inprocess


def _sleep(completion: str, gold: str) -> float | None:
    time.sleep(100)
    return 1.0


def _busy_c(completion: str, gold: str) -> float | None:
    return float(sum(range(10**15)))


def _raise(completion: str, gold: str) -> float | None:
    raise RuntimeError("reward exploded")


def _none(completion: str, gold: str) -> float | None:
    return None


def _heavy_imports(completion: str, gold: str) -> float | None:
    return 1.0 if any(m in sys.modules for m in ("torch", "lightning", "transformers")) else 0.0


_MISBEHAVIOURS = {"SLEEP": _sleep, "BUSY": _busy_c, "RAISE": _raise, "NONE": _none}


def _mixed(completion: str, gold: str) -> float | None:
    return _MISBEHAVIOURS.get(completion, math_score_inprocess)(completion, gold)


for _name, _fn in {"sleep": _sleep, "busy_c": _busy_c, "raise": _raise, "none": _none,
                   "heavy_imports": _heavy_imports, "mixed": _mixed}.items():
    REWARDS.register(_name)(_fn)
