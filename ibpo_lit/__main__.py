"""``python -m ibpo_lit fit --config configs/tiny.yaml``: the entry point.

`entry_point` runs the command line (`ibpo_lit.cli`) and turns a user error into one line,
``ibpo-lit: error: <message>``, with exit status 2 (`ibpo_lit.errors`). A plain help request
(``--help``, ``fit --help``) is answered from `ibpo_lit.help_cache` when its text is kept, so
it imports neither torch nor Lightning; this module imports nothing heavy for that reason.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import sys

from ibpo_lit.errors import debug_enabled, format_user_error, is_user_error
from ibpo_lit.help_cache import is_plain_help, keep_help, kept_help


# ibpo-lit's own subcommands, each with its own parser (Lightning's fit and validate are
# `ibpo_lit.cli`'s): "module:function", imported only when asked for.
SUBCOMMANDS = {
    "fetch": "ibpo_lit.models.fetch_cli:fetch_main",
    "export": "ibpo_lit.models.export_cli:export_main",
    "evaluate": "ibpo_lit.evaluation.cli:evaluate_main",
    "plan": "ibpo_lit.plan.cli:plan_main",
}


def main(args: list[str] | None = None, run: bool = True):
    """Parse ``args`` (default: the command line) and run the subcommand: one of ``SUBCOMMANDS``
    (its exit code), else Lightning's through `ibpo_lit.cli.main` (the LightningCLI)."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] and argv[0] in SUBCOMMANDS:
        module, function = SUBCOMMANDS[argv[0]].split(":")
        return getattr(importlib.import_module(module), function)(argv[1:])
    from ibpo_lit.cli import main as cli_main

    return cli_main(args, run)


def __getattr__(name: str):
    # `from ibpo_lit.__main__ import IBPOCLI` (and the rest of the command line's names) without
    # importing Lightning for every user of this module. Dunder names are the import system's
    # questions (`__path__` at every `from ... import`): never worth importing Lightning for.
    if name.startswith("__"):
        raise AttributeError(name)
    import ibpo_lit.cli

    try:
        return getattr(ibpo_lit.cli, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def _help(args: list[str] | None, argv: list[str]) -> int:
    """Print the help of ``argv`` (``args``, or the command line's when None), kept from an
    earlier call or rendered (and kept)."""
    text = kept_help(argv)
    if text is None:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main(args)
        text = out.getvalue()
        keep_help(argv, text)
    sys.stdout.write(text)
    return 0


def entry_point(args: list[str] | None = None) -> int:
    """``python -m ibpo_lit`` and the ``ibpo-lit`` command: an exit status, not the CLI object.

    A user error (see `ibpo_lit.errors.is_user_error`) ends with one line on stderr,
    ``ibpo-lit: error: <message>``, and status 2; ``IBPO_LIT_DEBUG=1`` re-raises it with its
    traceback. Other exceptions propagate (a traceback, status 1).
    """
    argv = sys.argv[1:] if args is None else list(args)
    try:
        result = _help(args, argv) if is_plain_help(argv) else main(args)
    except Exception as e:  # noqa: BLE001 - sorted into user errors and the rest just below
        if debug_enabled() or not is_user_error(e):
            raise
        sys.stdout.flush()
        print(format_user_error(e), file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(entry_point())
