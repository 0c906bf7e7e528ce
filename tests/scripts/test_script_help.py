"""Every script with a command line prints its ``--help`` and exits 0. argparse formats help
strings with ``%``, so a literal ``%`` in one (``index % n``) crashed ``--help`` of
exact_gradient_factorial.py while its runs worked. One subprocess runs every script's ``--help``
in turn (``runpy``, as ``__main__``): the imports are paid once, not once per script."""
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

RUNNER = r"""
import contextlib, io, runpy, sys
failed = []
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        failed.append(f"{path}: returned without printing help and exiting")
    except SystemExit as e:
        if e.code not in (0, None) or "usage:" not in out.getvalue():
            failed.append(f"{path}: exit {e.code!r}, usage printed: {'usage:' in out.getvalue()}")
    except Exception as e:
        failed.append(f"{path}: {type(e).__name__}: {e}")
print("\n".join(failed) or "ALL OK")
"""


def with_command_line() -> list[Path]:
    return sorted(p for p in SCRIPTS.glob("*.py") if "ArgumentParser(" in p.read_text())


def test_every_script_prints_its_help():
    scripts = with_command_line()
    assert len(scripts) >= 10  # the benches, compare, report, the exact-gradient scripts
    proc = subprocess.run([sys.executable, "-c", RUNNER, *map(str, scripts)], capture_output=True, text=True,
                          timeout=600, cwd=SCRIPTS.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "ALL OK", proc.stdout[-3000:]
