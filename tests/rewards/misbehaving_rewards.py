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

Batch-form rewards (TRL's ``fn(prompts, completions, **columns)``), used by import path
(``misbehaving_rewards:divides_by_zero``) in training runs; a user's reward that fails looks
like these:

- `divides_by_zero`: raises ZeroDivisionError on every call.
- `hangs`: sleeps 100 s on every call (killed at the pool's timeout).
- `one_short`: one value fewer than completions.
- `not_a_list`: a string instead of a list.
- `half_not_numbers`: a string for half the completions (by a CRC of the text), numbers for
  the rest: some responses unscorable in every call, never all.
- `raises_on_odd`: raises when a completion of the call has an odd CRC (with
  ``reward_batch_size: 1``, about every other call), scores 1 otherwise.
- `fails_two_calls_in_three`: raises on the 1st and 2nd call of every three in its worker
  process, scores by a CRC on the 3rd (one worker, one call per scoring: two unscorable steps,
  then a scorable one).
- `fails_on_rank_zero_then_everywhere`: raises in the reward workers of process rank 0
  (``RANK``, which ibpo-lit exports in multi-process runs before any reward worker starts) at
  every call, and on the other ranks from their worker's second call on (the first scores by
  a CRC).
"""
from __future__ import annotations

import itertools
import os
import sys
import time
import zlib

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


# ------------------------------------------------------------------ batch form, by import path
def _parity(completions: list[str]) -> list[float]:
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]


def divides_by_zero(prompts, completions, **kwargs):
    return [len(c) / 0 for c in completions]


def hangs(prompts, completions, **kwargs):
    time.sleep(100)
    return [1.0] * len(completions)


def one_short(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def not_a_list(prompts, completions, **kwargs):
    return "1.0"


def half_not_numbers(prompts, completions, **kwargs):
    return ["oops" if zlib.crc32(c.encode()) % 2 else 1.0 for c in completions]


def raises_on_odd(prompts, completions, **kwargs):
    if any(zlib.crc32(c.encode()) % 2 for c in completions):
        raise RuntimeError("judge offline")
    return [1.0] * len(completions)


_calls = itertools.count(1)


def fails_two_calls_in_three(prompts, completions, **kwargs):
    if next(_calls) % 3:
        raise RuntimeError("judge offline")
    return _parity(completions)


def fails_on_rank_zero_then_everywhere(prompts, completions, **kwargs):
    """Raises on process rank 0 at every call, and on the others from their second call on."""
    if os.environ.get("RANK") == "0" or next(_calls) > 1:
        raise RuntimeError("judge offline")
    return _parity(completions)
