"""A launcher that switches guards of the sandbox off, for the attack suites' "guard off" arms.

`Isolation.launcher` is argv run before the sandbox's own (bwrap's). `editing` returns an
isolation whose launcher rewrites bwrap's arguments (options added or dropped, before the
program's command) and execs it, optionally with address randomization back on: the same
sandbox, the same program, with exactly the named guards changed.
"""
from __future__ import annotations

import dataclasses
import json
import sys

from ibpo_lit.rewards.sandbox.isolation import Isolation

_EDIT = r"""
import ctypes, json, os, sys
spec, argv = json.loads(sys.argv[1]), sys.argv[2:]
out, i = [argv[0], *spec["insert"]], 1
while i < len(argv) and argv[i] != "--":
    for option, nargs, first in spec["drop"]:
        if argv[i] == option and (first is None or argv[i + 1] == first):
            i += 1 + nargs
            break
    else:
        out.append(argv[i])
        i += 1
out += argv[i:]
if spec["aslr"]:
    libc = ctypes.CDLL(None)
    libc.personality(libc.personality(0xFFFFFFFF) & ~0x0040000)  # ADDR_NO_RANDOMIZE off
os.execv(out[0], out)
"""


def editing(iso: Isolation, *, insert: tuple = (), drop: tuple = (), aslr: bool = False) -> Isolation:
    """``iso`` with bwrap started as ``bwrap *insert <its arguments less drop> -- ...``.

    Args:
        insert: Arguments put first (``("--proc", "/proc")``).
        drop: ``(option, nargs, first)``: each occurrence of ``option`` with its ``nargs``
            arguments, only where its first argument is ``first`` (None: any).
        aslr: Turn address randomization back on for the sandbox.
    """
    if not iso.bwrap:
        raise ValueError("editing bwrap's arguments needs bwrap")
    spec = json.dumps({"insert": list(insert), "drop": [list(d) for d in drop], "aslr": aslr})
    return dataclasses.replace(iso, launcher=(sys.executable, "-I", "-S", "-c", _EDIT, spec))
