"""Hostile programs: each scores 0, leaves the machine as it was, and the pool keeps scoring.

Every case runs next to a good program in one `SandboxPool` batch, so each test also checks that
training goes on (the good program passes while the bad one misbehaves). After each run: no
process whose command line names the run (or the case's own marker) is left, the run's cgroups
are gone, and the sentinel files are intact.

Cases that rely on the OS (bwrap's namespaces, the per-run uid) are skipped where the caller is
not root; the forgery cases run everywhere, since the verdict is the judge's whatever the OS.
The attack classes of issue 17 (forged passes, unscorable instead of wrong, judge memory, state
across runs, survivors, trust in the data) are in test_code_attacks.py.
"""
import hashlib
import os
import secrets
import socket
import time
from pathlib import Path

import pytest

from ibpo_lit.rewards import CodeTests, SandboxPool
from ibpo_lit.rewards.code import detect_isolation
from ibpo_lit.rewards.sandbox.box import SANDBOX_UID

GOOD = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-4, 9) == 5"]
BAD_TIMEOUT_S = 1.5
SENTINEL = Path(__file__).resolve().parents[1] / "fixtures" / "livecodebench_sample.jsonl"
ENTRY = ("add",)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(num_workers=2) as p:
        yield p
    assert p.stats["unscorable"] == 0


def _gold(tests=TESTS, timeout_s=BAD_TIMEOUT_S, entries=ENTRY, memory_mb=None):
    return CodeTests(tests=tests, timeout_s=timeout_s, remote=entries, memory_mb=memory_mb).to_gold()


def _processes_naming(token: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _contained(pool, program, statuses, tests=TESTS, marker=None, proofs=(), entries=ENTRY, timeout_s=BAD_TIMEOUT_S,
               memory_mb=None):
    """Run ``program`` beside a good one; check the score, the status and what is left behind.

    ``proofs`` are tests that must pass, showing that the attack really ran (they come first);
    the reward is still 0, since the other tests fail. ``entries``: the names the tests take
    from the program.
    """
    digest = hashlib.sha256(SENTINEL.read_bytes()).hexdigest()
    start = time.monotonic()
    gold = _gold([*proofs, *tests], timeout_s, entries, memory_mb)
    bad, good = pool.run([(program, gold), (GOOD, _gold(timeout_s=30))])
    assert time.monotonic() - start < timeout_s + 15
    assert good is not None and good.status == "pass", "the pool must keep scoring good programs"
    assert bad is not None, "a hostile program is the program's failure, never unscorable"
    assert bad.tests[:len(proofs)] == ("pass",) * len(proofs), ("the attack did not run", bad.detail)
    assert bad.passed == len(proofs) < bad.total  # so the reward ("all" tests) is 0
    assert bad.tests[len(proofs)] in statuses or bad.status in statuses, (bad.tests, bad.detail)
    deadline = time.monotonic() + 2
    while (_processes_naming(bad.run_id) or (marker and _processes_naming(marker))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _processes_naming(bad.run_id), "processes of the run outlived it"
    assert not (marker and _processes_naming(marker)), "a process the program started outlived it"
    for parent in detect_isolation().cgroups.values():
        assert not os.path.exists(os.path.join(parent, bad.run_id))
        assert not os.path.exists(os.path.join(parent, bad.run_id + "-judge"))
    assert hashlib.sha256(SENTINEL.read_bytes()).hexdigest() == digest
    return bad


# ------------------------------------------------------------------ forging the verdict (any OS)
def test_exit_before_the_tests(pool):
    _contained(pool, "import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b\n", {"error"})
    _contained(pool, "import os\nos._exit(0)\n", {"error"})
    _contained(pool, "import atexit, os\natexit.register(os._exit, 0)\nraise SystemExit\n", {"error"})


def test_printing_fake_success_markers(pool):
    program = (
        "import json, os, sys\n"
        "fake = json.dumps({'passed': 2, 'total': 2, 'status': 'pass', 'tests': ['pass', 'pass']})\n"
        "print(fake); print('ALL TESTS PASSED'); print(fake, file=sys.stderr)\n"
        "for fd in range(3, 64):\n"
        "    try:\n        os.write(fd, fake.encode())\n    except OSError:\n        pass\n"
        "def add(a, b):\n    return None\n"
    )
    _contained(pool, program, {"error", "fail"})


def test_objects_that_equal_everything(pool):
    program = (
        "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "class YesInt(int):\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Yes() if a > 0 else YesInt(0)\n"
    )
    _contained(pool, program, {"fail"})


def test_overriding_builtins_and_the_harness(pool):
    program = (
        "import builtins, sys, gc\n"
        "builtins.AssertionError = type('AssertionError', (Exception,), {})\n"
        "builtins.isinstance = lambda *a: True\n"
        "builtins.len = lambda *a: 0\n"
        "main = sys.modules['__main__']\n"
        "main.encode = lambda value, keep: 3\n"  # every reply of the in-sandbox server is now 3
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, dict) and 'write_frame' in obj:\n"
        "        obj['read_frame'] = lambda fd, n: [99, 'load', [], {'l': []}, {'d': []}]\n"
        "def add(a, b):\n    return None\n"
    )
    # At best the program answers 3 to everything: that passes add(1, 2) == 3 only by being right
    # there, so this asks for two different answers.
    _contained(pool, program, {"fail", "error"}, tests=["assert add(1, 3) == 4", "assert add(-4, 9) == 5"])


def test_injecting_names_into_the_judge(pool):
    # The server's replies are the program's to forge: here the reply that resolves the tested
    # names also offers a replacement for the trusted helper the tests call.
    program = (
        "import sys\n"
        "main = sys.modules['__main__']\n"
        "real_encode = main.encode\n"
        "def encode(value, keep):\n"
        "    if isinstance(value, dict) and 'add' in value:\n"
        "        value = dict(value, close_enough=lambda got, want: True, math=None)\n"
        "    return real_encode(value, keep)\n"
        "main.encode = encode\n"
        "def add(a, b):\n    return 0\n"
    )
    gold = CodeTests(tests=["assert close_enough(add(1, 2), 3)", "assert math.isclose(add(1, 2), 3)"],
                     prelude="def close_enough(got, want):\n    return abs(got - want) < 1e-9\n",
                     timeout_s=BAD_TIMEOUT_S, remote=ENTRY).to_gold()
    (result,) = pool.run([(program, gold)])
    assert result.tests == ("fail", "fail"), result.detail


def test_stop_iteration_cannot_cut_a_test_short(pool):
    program = "def add(a, b):\n    raise StopIteration\n"
    gold = CodeTests(tests=["assert all(map(lambda ab: add(*ab) == sum(ab), [(1, 2), (3, 4)]))"],
                     timeout_s=BAD_TIMEOUT_S, remote=ENTRY).to_gold()
    (result,) = pool.run([(program, gold)])
    assert result.passed == 0, result.detail


def test_infinite_loops_in_python_and_in_c(pool):
    _contained(pool, "def add(a, b):\n    while True:\n        pass\n", {"timeout"})
    _contained(pool, "def add(a, b):\n    return sum(range(10 ** 15))\n", {"timeout"})  # one C call
    _contained(pool, "def add(a, b):\n    return pow(3, 10 ** 9)\n", {"timeout", "memory"})  # huge pow


def test_memory_hog(pool):
    # 128 MB reached in 13 steps, with 10 s to do it: under load the limit is still hit long
    # before the clock (at 1 GB and 1.5 s, a starved run timed out first).
    _contained(pool, "x = bytearray(8 << 30)\n", {"memory"}, timeout_s=10, memory_mb=128)
    _contained(pool, "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n", {"memory"}, timeout_s=10,
               memory_mb=128)


# ------------------------------------------------------------------ escaping the sandbox (needs the OS)
def test_fork_bomb(pool, isolated):
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    _contained(pool, program, {"timeout", "error"})


def test_disk_filler(pool, isolated):
    marker = f"ibpo-fill-{secrets.token_hex(4)}"
    many = f"i = 0\nwhile True:\n    open(f'/tmp/{marker}-{{i}}', 'wb').write(b'x' * 10 ** 6)\n    i += 1\n"
    _contained(pool, many, {"error", "timeout"})
    # Building the 1 GB buffer alone can outlast the 1.5 s limit on a loaded machine: a timeout
    # contains it as well as the write error does; either way nothing may be left behind.
    _contained(pool, f"open('/dev/shm/{marker}', 'wb').write(b'x' * 10 ** 9)\n", {"error", "timeout"})
    leftovers = [p for d in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(d).glob(f"{marker}*")]
    assert not leftovers


def test_deleting_and_writing_files_outside(pool, isolated, tmp_path):
    """The host's files are out of sight (the checkout, wherever it lives, /tmp included) or
    read-only (the interpreter, /usr); what the program writes lands in its own tmpfs."""
    mine = tmp_path / "sentinel.txt"
    mine.write_text("keep me")
    program = (
        "import os, shutil, sys\n"
        f"targets = [{str(SENTINEL)!r}, {str(mine)!r}, os.__file__, '/usr/bin/env']\n"
        "for t in targets:\n"
        "    for action in (os.remove, lambda p: open(p, 'w').write('pwned'), lambda p: shutil.rmtree(os.path.dirname(p))):\n"
        "        try:\n            action(t)\n        except Exception:\n            pass\n"
        f"for d in ({str(SENTINEL.parent)!r}, {str(tmp_path)!r}, '/', '/etc', '/usr', '/root', '/work', sys.prefix):\n"
        "    try:\n        open(os.path.join(d, 'pwned'), 'w').write('x')\n    except Exception:\n        pass\n"
        "def add(a, b):\n    return os.path.exists(targets[0]) or os.path.exists(targets[1])\n"
        "def intact():\n    return os.path.exists(targets[2]) and os.path.exists(targets[3])\n"
        "def writes_its_own_tmp():\n    open('/tmp/mine', 'w').write('x')\n    return open('/tmp/mine').read() == 'x'\n"
    )
    _contained(pool, program, {"fail"}, proofs=["assert intact() and writes_its_own_tmp()"],
               entries=("add", "intact", "writes_its_own_tmp"))
    assert mine.read_text() == "keep me"
    assert not any((d / "pwned").exists() for d in (SENTINEL.parent, tmp_path, Path("/etc"), Path("/root"), Path("/work")))


def test_reading_the_trainers_environment(pool, isolated, monkeypatch):
    secret = f"ibpo-secret-{secrets.token_hex(8)}"
    monkeypatch.setenv("IBPO_TEST_SECRET", secret)
    program = (
        "import os\n"
        "def sources():\n"
        "    found = [v for v in os.environ.values()]\n"
        "    for pid in (os.listdir('/proc') if os.path.isdir('/proc') else []):\n"  # (the sandbox has none)
        "        for name in ('environ', 'cmdline'):\n"
        "            try:\n                found.append(open(f'/proc/{pid}/{name}', 'rb').read().decode('latin-1'))\n"
        "            except Exception:\n                pass\n"
        f"    for pid in ({os.getpid()}, {os.getppid()}):\n"
        "        try:\n            found.append(open(f'/proc/{pid}/environ', 'rb').read().decode('latin-1'))\n"
        "        except Exception:\n            pass\n"
        "    return found\n"
        "def leak():\n"
        "    hits = [s for s in sources() if 'ibpo-secret-' in s]\n"
        "    return hits[0][hits[0].index('ibpo-secret-'):][:len('ibpo-secret-') + 16] if hits else None\n"
    )
    _contained(pool, program, {"fail"}, tests=[f"assert leak() == {secret!r}"],
               proofs=["assert len(sources()) > 5 and leak() is None"], entries=("sources", "leak"))


def test_opening_a_network_connection(pool, isolated):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    program = (
        "import socket\n"
        "def add(a, b):\n"
        f"    for host, port in (('127.0.0.1', {port}), ('1.1.1.1', 80), ('8.8.8.8', 53)):\n"
        "        try:\n"
        "            socket.create_connection((host, port), timeout=0.5).sendall(b'pwned')\n"
        "            return a + b\n"
        "        except OSError:\n"
        "            pass\n"
        "    return None\n"
        "def has_sockets():\n    return socket.socket().fileno() > 0\n"
    )
    try:
        _contained(pool, program, {"fail"}, proofs=["assert has_sockets()"], entries=("add", "has_sockets"))
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()


@pytest.mark.parametrize("spawn", ["posix.system", "os.posix_spawn", "subprocess"])
def test_spawning_processes_that_linger(pool, isolated, spawn):
    marker = f"ibpo-linger-{secrets.token_hex(4)}"
    calls = {
        "posix.system": f"import posix\nposix.system(\"sh -c 'sleep 1000; true' {marker} &\")\n"
                        f"posix.system('touch /tmp/{marker}')\n",
        "os.posix_spawn": f"import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'sleep 1000; true', '{marker}'], {{}})\n"
                          f"os.posix_spawn('/bin/sh', ['sh', '-c', 'setsid sleep 1000 {marker}'], {{}})\n",
        "subprocess": f"import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 1000; true', '{marker}'], "
                      "start_new_session=True)\n",
    }
    program = calls[spawn] + (
        "import os, time\ntime.sleep(0.2)\n"
        "def alive(pid):\n    try:\n        os.kill(pid, 0)\n        return True\n"
        "    except ProcessLookupError:\n        return False\n"
        "def lingering():\n"  # a process past bwrap's init (1) and the program (2): no /proc to read its name in
        "    return [p for p in range(3, 1000) if alive(p)]\n"
        "def add(a, b):\n    return 0\n"
    )
    _contained(pool, program, {"fail"}, marker=marker, proofs=["assert lingering()"], entries=("add", "lingering"))
    assert not Path(f"/tmp/{marker}").exists()


def test_ctypes(pool, isolated):
    program = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None)\n"
        "def add(a, b):\n"  # passes only with root back
        "    return a + b if libc.setuid(0) == 0 and libc.setgid(0) == 0 else None\n"
        "def getuid():\n    return libc.getuid()\n"
    )
    # the sandbox's own uid (the host's is the run's fresh one: test_detected_isolation_as_root)
    _contained(pool, program, {"fail"}, proofs=[f"assert getuid() == {SANDBOX_UID}"], entries=("add", "getuid"))
    _contained(pool, "import ctypes\nctypes.string_at(0)\n", {"error"})  # a segfault


def test_killing_the_parent(pool, isolated):
    program = (
        "import os, signal\n"
        f"for pid in (os.getppid(), {os.getpid()}, {os.getppid()}, 1, -1):  # not 0: its own group is suicide\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except Exception:\n        pass\n"
        "for pid in range(1, 1000):\n"  # all but itself (bwrap's init among them)
        "    try:\n        pid != os.getpid() and os.kill(pid, signal.SIGKILL)\n    except Exception:\n        pass\n"
        "def add(a, b):\n    return 0\n"
        "def alive():\n    return True\n"
    )
    _contained(pool, program, {"fail", "error"}, proofs=["assert alive()"], entries=("add", "alive"))
