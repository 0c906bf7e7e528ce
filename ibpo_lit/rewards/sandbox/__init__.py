"""The code sandbox's parts; the public API is `ibpo_lit.rewards.code`.

- ``isolation.py``: what the OS allows (bwrap, a per-run uid, cgroups), found and probed once.
- ``judge.py``: the trusted interpreter that runs the tests (started by `run_tests`).
- ``box.py``: the judge's side of one sandbox: start it, send it requests, kill it.
- ``child.py``: the sandboxed interpreter that confines itself and runs the program.
- ``wire.py``: framing and the data-only codec between the two.
- ``pool.py``: `SandboxPool`, a bounded number of runs at a time, with status counts.

``judge.py``, ``box.py``, ``child.py`` and ``wire.py`` import only the standard library: they run as
``python -I -S -c <source>`` (the judge) or ``python -s -S -c <source>`` (the sandboxed child, whose
environment is the sandbox's own). Nothing is imported here, so importing one of them stays cheap.
"""
