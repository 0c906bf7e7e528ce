"""Errors a user can act on, and how the command line reports them.

``python -m ibpo_lit fit ...`` ends a run that failed on a user error (a bad setting, a bad data
file, a missing model path, a run of non-finite steps) with one line on stderr,
``ibpo-lit: error: <message>``, and exit status 2, as argparse does for a bad option. Anything
else is a bug or an environment failure and keeps its full traceback. ``IBPO_LIT_DEBUG=1``
shows the traceback of user errors too.

What counts as a user error (`is_user_error`):
- `UserError` and its subclasses (`ConfigError`, `ModelNotFoundError`, `ModelLoadError`,
  `UnscorableRewardsError`, `HubPushError`), anywhere;
- ``NonFiniteError`` (``max_nonfinite_steps`` in a row) and Lightning's
  ``MisconfigurationException`` (their messages say what to change);
- `ValueError` and `FileNotFoundError` raised by ibpo-lit's own code (``ibpo_lit/``,
  ``callbacks/``): that is where settings and inputs are validated, each message naming the field
  or the file and line. The same exception types raised inside torch or transformers are more
  likely a bug than a user error, so they keep their traceback.

What is not covered: warnings (they go through `warnings`/logging as usual).
"""
from __future__ import annotations

import os
import traceback
from pathlib import Path

DEBUG_ENV = "IBPO_LIT_DEBUG"
PROG = "ibpo-lit"

# Code whose ValueError / FileNotFoundError is a validation message.
_OWN_ROOTS = tuple(str(Path(__file__).resolve().parent.parent / name) + os.sep for name in ("ibpo_lit", "callbacks"))


class UserError(Exception):
    """Something the user can fix: the message says what and where."""


class ConfigError(UserError, ValueError):
    """Invalid or contradictory settings; the message names the keys (``model.rollout.group_size``)."""


class ModelNotFoundError(UserError, FileNotFoundError):
    """A local model path that does not exist or is not a model directory."""


class ModelLoadError(UserError, OSError):
    """A hub id that could not be loaded (offline, a typo, no access)."""


class UnscorableRewardsError(UserError, RuntimeError):
    """The reward scored no response at all, ``model.max_unscorable_steps`` steps in a row (it
    raises, hangs, returns the wrong length or type, or its sandbox cannot run): the message
    names the reward and its last error."""


class HubPushError(UserError, OSError):
    """``export --push_to_hub`` could not upload (offline, not logged in, no access); the
    folder was written, and the message says where and how to push it later."""


def debug_enabled() -> bool:
    """True when ``IBPO_LIT_DEBUG`` is set to anything but ``""``/``0``."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is reported as one line rather than a traceback (see the module docstring)."""
    if isinstance(exc, UserError):
        return True
    if type(exc).__name__ in ("NonFiniteError", "MisconfigurationException"):
        return True
    if isinstance(exc, (ValueError, FileNotFoundError)):
        return _raised_by_own_code(exc)
    return False


def _raised_by_own_code(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    filename = str(Path(frames[-1].filename).resolve())
    return filename.startswith(_OWN_ROOTS)


def format_user_error(exc: BaseException) -> str:
    """``ibpo-lit: error: <message>``; a message-less exception shows its type instead."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename:  # "[Errno 2] No such file..." -> plain
        message = f"{exc.strerror}: {exc.filename}"
    else:
        message = str(exc).strip() or type(exc).__name__
    return f"{PROG}: error: {message}"
