"""Issue 43, item 7: the Python tool's output is a function of the rollout's cells, so resume and
the one-versus-two-process equality hold; replay shows nothing of the earlier cells' output.

* The same rollout run twice, each call a fresh sandboxed interpreter, gives the same bytes:
  sets of strings (the interpreter's hash seed is fixed: ``-I`` used to ignore PYTHONHASHSEED),
  object addresses in reprs and ``id()`` (address randomization is off in the sandbox),
  ``random`` (seeded by the wrapper, so a replayed cell draws what it drew the first time), the
  pid, uid and hostname. Guards off: the hash seed dropped, or randomization back on, and the
  same cells differ between two runs.
* Replay discards the earlier cells' output however it was written: ``print``,
  ``sys.__stdout__`` left unflushed, ``os.write`` to fds 1 and 2, a child process, one still
  writing after its cell ended. Guard off: the earlier cells silenced at the level of
  ``sys.stdout`` only (``contextlib.redirect_stdout``, what replay did before): the descriptor
  writes show up in the later cell's output.

Not covered (docs/tools.md): the clock, the kernel's entropy (``os.urandom``, ``secrets``,
``uuid4``, a ``random.Random()`` of its own), threads an earlier cell left printing.
"""
import pytest

from ibpo_lit.rewards.code import CodeTests, run_code_tests
from ibpo_lit.rewards.python_tool import PythonTool

from sandbox_launchers import editing

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]
EARLIER = ("import os, random, subprocess, sys\n"
           "print('p-earlier')\n"
           "sys.stdout.write('s-earlier\\n')\n"
           "sys.__stdout__.write('raw-earlier')\n"  # no newline: left in the buffer
           "os.write(1, b'fd1-earlier\\n')\n"
           "os.write(2, b'fd2-earlier\\n')\n"
           "print('e-earlier', file=sys.stderr)\n"
           "subprocess.run(['sh', '-c', 'echo sub-out-earlier; echo sub-err-earlier >&2'])\n"
           "subprocess.Popen(['sh', '-c', 'sleep 0.3; echo late-earlier'])\n"  # still writing after its cell
           "drawn = random.random()\n")
LATER = ("import time\ntime.sleep(0.6)\n"
         "class Plain:\n    pass\n"
         f"print(set({WORDS!r}), hash('x'))\n"
         "print(Plain(), id(object()))\n"
         "print(drawn, random.random(), os.getpid(), os.getuid(), os.uname().nodename)\n")


def _twice(iso, cells):
    tool = PythonTool(timeout_s=10.0, workers=1, max_output_chars=4000, isolation=iso)
    try:
        return [tool([cells])[0] for _ in range(2)]
    finally:
        tool.close()


def test_the_same_rollout_gives_the_same_bytes_twice(sandbox):
    first, second = _twice(sandbox, [EARLIER, LATER])
    assert first.status == second.status == "pass", (first.text, second.text)
    assert first.text.encode() == second.text.encode(), (first.text, second.text)
    lines = first.text.splitlines()
    assert len(lines) == 3 and lines[0].startswith("{'") and lines[1].startswith("<__main__.Plain object at 0x")
    assert "earlier" not in first.text  # nothing of the earlier cell's output, however written
    assert lines[2].split()[2:] == ["2", "1000", "sandbox"]  # pid, uid, hostname: the sandbox's own


def test_an_error_shows_none_of_the_earlier_cells_stderr(sandbox):
    tool = PythonTool(timeout_s=10.0, workers=1, isolation=sandbox)
    try:
        r = tool([[EARLIER, "time = 1\nraise ValueError('later')"]])[0]
    finally:
        tool.close()
    assert r.status == "error" and r.text.rstrip().endswith("ValueError: later"), r.text
    assert "earlier" not in r.text, r.text


def test_a_replayed_cell_draws_what_it_drew_the_first_time(sandbox):
    tool = PythonTool(timeout_s=10.0, workers=1, isolation=sandbox)
    try:
        alone, replayed = tool([["import random\nprint(random.random())"],
                                ["import random\nprint(random.random())", "print(random.random())"]])
        again = tool([["import random\nx = random.random()", "print(x)"]])[0]
    finally:
        tool.close()
    assert alone.text == again.text and alone.text != replayed.text, (alone.text, again.text, replayed.text)


@pytest.mark.parametrize("guard", ["hash seed", "address randomization"])
def test_guard_off_the_same_cells_differ_between_runs(sandbox, guard):
    if guard == "hash seed":
        iso = editing(sandbox, drop=(("--setenv", 2, "PYTHONHASHSEED"),))
        line = 0
    else:
        iso = editing(sandbox, aslr=True)
        line = 1
    first, second = _twice(iso, [EARLIER, LATER])
    assert first.status == second.status == "pass", (first.text, second.text)
    assert first.text.splitlines()[line] != second.text.splitlines()[line], (first.text, second.text)
    # the other guard still holds: only the named one was switched off
    assert first.text.splitlines()[1 - line] == second.text.splitlines()[1 - line], (first.text, second.text)


# What replay did before: the earlier cells under contextlib.redirect_stdout/redirect_stderr.
_SWAPPED_ONLY = '''\
import contextlib, io, sys
sys.stdout.reconfigure(line_buffering=True)
for source in {earlier!r}:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            exec(compile(source, "<cell>", "exec"), globals())
        except BaseException:
            pass
exec(compile({last!r}, "<cell>", "exec"), globals())
'''


def test_guard_off_descriptor_writes_of_earlier_cells_reach_the_output(sandbox):
    spec = CodeTests(kind="run", timeout_s=10.0)
    off = run_code_tests(_SWAPPED_ONLY.format(earlier=[EARLIER], last=LATER), spec, extract=False, isolation=sandbox)
    assert off.status == "pass", off.detail
    for leaked in ("raw-earlier", "fd1-earlier", "sub-out-earlier", "late-earlier"):
        assert leaked in off.stdout, off.stdout
    assert "p-earlier" not in off.stdout  # what the swap did catch
