"""Issue 17's attack classes, one test each, and each shown to work where its guard is off.

"Guard off" is the weaker setting the attack defeats: a name the tests compare with declared as
the program's (as the judge guessed before), the program's files shared with the host
(`Isolation.none`: no namespaces, the judge and the program as the caller's root), a data file
loaded with ``allow_non_assert``. The same program then fails with the guard on.
"""
import ctypes
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ibpo_lit.rewards import CodeTests, SandboxPool, run_tests
from ibpo_lit.rewards.code import frame_limit, judge_memory_mb
from ibpo_lit.rewards.sandbox.isolation import Isolation

NONE = Isolation.none()
CHECKOUT_FILE = Path(__file__).resolve()  # a file of the trainer's: out of the program's sight


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


# ------------------------------------------------------------------ forged passes
FRACTION_TESTS = ["assert half(3) == Fraction(3, 2)"]
FORGER = "def Fraction(*args):\n    return 7\ndef half(x):\n    return 7\n"  # equal as plain data


def test_names_on_the_expected_side_are_the_judges():
    # Guard off: the expected side's Fraction taken from the program (what the judge guessed before).
    off = run_tests(FORGER, FRACTION_TESTS, prelude="from fractions import Fraction", remote=("half", "Fraction"))
    assert off.status == "pass"
    on = run_tests(FORGER, FRACTION_TESTS, prelude="from fractions import Fraction", remote=("half",))
    assert on.status == "fail"
    right = "from fractions import Fraction\ndef half(x):\n    return Fraction(x, 2)\n"
    # A value of the program's class is a handle, not data: even the right Fraction cannot be
    # compared (fractions travel as their program objects); the test needs plain data, so use floats.
    assert run_tests(right, ["assert float(half(3)) == 1.5"], remote=("half",)).status == "error"
    assert run_tests("def half(x):\n    return x / 2\n", ["assert math.isclose(half(3), 1.5)"],
                     remote=("half",)).status == "pass"


def test_a_module_the_tests_use_is_the_judges():
    program = ("class math:\n    @staticmethod\n    def isclose(*a, **k):\n        return True\n"
               "def half(x):\n    return 0\n")
    tests = ["assert math.isclose(half(3), 1.5)"]
    assert run_tests(program, tests, remote=("half", "math")).status == "pass"  # guard off
    assert run_tests(program, tests, remote=("half",)).status == "fail"


def test_values_made_by_setup_are_the_judges():
    # The program rebinds a builtin that the setup uses to make the expected value.
    program = "import builtins\nbuiltins.sum = lambda *a: 99\ndef answer():\n    return 99\n"
    tests = ["assert answer() == target"]
    # Guard off: setup run in the program (as a suffix) and its value taken from there.
    assert run_tests(program, tests, suffix="target = sum([20, 22])", remote=("answer", "target")).status == "pass"
    assert run_tests(program, tests, setup="target = sum([20, 22])", remote=("answer",)).status == "fail"


def test_two_handles_never_compare_equal():
    # The program answers every handle request with the same number, and its objects equal all.
    program = (
        "import sys\nmain = sys.modules['__main__']\n"
        "real = main.encode\n"
        "main.encode = lambda value, keep: real(value, lambda obj: dict(keep(obj), h=1))\n"
        "class Same:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def make(x):\n    return Same()\n"
    )
    tests = ["assert make(1) == make(2)", "assert not (make(1) != make(2))", "assert [make(1)] == [make(2)]"]
    r = run_tests(program, tests, remote=("make",))
    assert r.tests == ("fail", "fail", "fail"), r.detail


# ------------------------------------------------------------------ unscorable instead of wrong
def test_an_assert_message_the_judge_cannot_print_is_a_fail():
    # The message is the program's value: an int too long for str(), or a handle whose __str__
    # loops. Before, formatting it raised outside the guard: unscorable (None), advantage 0.
    program = ("class Loud:\n    def __str__(self):\n        while True:\n            pass\n"
               "def f(x):\n    return 10 ** 5000\n"
               "def g():\n    return Loud()\n")
    r = run_tests(program, ["assert f(1) == 2, f(1)", "assert f(1) == 3, g()"], remote=("f", "g"), timeout_s=3)
    assert r.tests == ("fail", "fail") and r.status == "fail", r.detail


def test_output_decimal_cannot_compare_is_a_fail():
    # Decimal('sNaN') != Decimal(1) raises InvalidOperation: it used to escape the judge.
    tests = [{"input": "", "output": "1\n"}, {"input": "", "output": "2\n"}]
    r = run_tests("print('sNaN')\n", tests, kind="stdin")
    assert r.tests == ("fail", "fail"), r.detail


def test_hashing_an_adversarial_set_in_the_judge_is_a_timeout():
    # 200k ints that all hash to 0 (multiples of 2**61 - 1): building the decoded set takes
    # quadratic time in C, where no signal reaches; the caller's watchdog stops the judge, and
    # the program, not the harness, is scored: a timeout, never None.
    program = "def f():\n    return set(range(0, 200_000 * (2 ** 61 - 1), 2 ** 61 - 1))\n"
    start = time.monotonic()
    r = run_tests(program, ["assert f() == {0}"], remote=("f",), timeout_s=1.5)
    assert (r.status, r.passed, r.tests) == ("timeout", 0, ("timeout",)), r.detail
    assert time.monotonic() - start < 1.5 + 5 + 5  # the program's limit, the clean-up grace, start-up


def test_a_reply_too_deep_to_decode_is_the_programs_error():
    program = "def f():\n    x = []\n    for _ in range(150):\n        x = [x]\n    return x\n"
    r = run_tests(program, ["assert f() == []"], remote=("f",))
    assert r.status == "error" and "program gone" in r.detail, r.detail


# ------------------------------------------------------------------ judge memory
def test_reply_limits_follow_the_programs_memory():
    assert frame_limit(128) == 4 << 20 and frame_limit(1024) == 32 << 20 and frame_limit(8192) == 64 << 20
    assert judge_memory_mb(128) == 256 + 24 * 4
    program = "def f():\n    return 'x' * (6 << 20)\n"  # 6 MB: over a 128 MB program's 4 MB frame
    r = run_tests(program, ["assert len(f()) == 1"], remote=("f",), memory_mb=128)
    assert r.status == "error" and "exceeds the limit" in r.detail, r.detail
    assert run_tests(program, ["assert len(f()) == 6 << 20"], remote=("f",), memory_mb=1024).status == "pass"


def test_the_judge_is_not_root_and_has_its_own_cgroup(isolated):
    program = "import time\ndef f():\n    time.sleep(2)\n    return 1\n"
    seen, done = {}, threading.Event()

    def watch():  # the judge's last observed state, while the program sleeps in f()
        while not done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    cgroups = Path(f"/proc/{pid}/cgroup").read_text()
                except OSError:
                    continue
                if "-judge" in cgroups and "ibpo_sandbox" in cgroups:
                    seen["uid"] = int(status.split("Uid:")[1].split()[0])
                    seen["groups"] = [line for line in cgroups.splitlines() if "ibpo_sandbox" in line]
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert run_tests(program, ["x = f()\nassert x == 1"], remote=("f",)).status == "pass"
    finally:
        done.set()
        watcher.join()
    assert seen["uid"] >= 2 ** 20, seen  # root only while it set up
    assert {g.split(":")[1] for g in seen["groups"]} == set(isolated.cgroups)  # pids and memory


# ------------------------------------------------------------------ state across runs
_KEYS = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
         "def add_key(name):\n"  # add_key(2) into the user keyring (-4)
         "    return libc.syscall(248, b'user', name.encode(), b'secret', 6, ctypes.c_long(-4))\n"
         "def find_key(name):\n"  # keyctl(KEYCTL_SEARCH=10, user keyring, type, description, 0)
         "    return libc.syscall(250, 10, ctypes.c_long(-4), b'user', name.encode(), 0)\n")


@pytest.mark.parametrize("guard", ["off", "on"])
def test_no_kernel_state_keyed_by_uid_carries_between_runs(guard, isolated):
    name = f"ibpo-{secrets.token_hex(4)}"
    iso = NONE if guard == "off" else isolated
    first = run_tests(_KEYS, [f"assert add_key({name!r}) > 0"], remote=("add_key",), isolation=iso)
    # guarded, the keyrings are out of reach (seccomp: add_key and keyctl fail with EPERM)
    assert first.status == ("pass" if guard == "off" else "fail"), first.detail
    second = run_tests(_KEYS, [f"assert find_key({name!r}) > 0"], remote=("find_key",), isolation=iso)
    if guard == "off":
        assert second.status == "pass"  # same uid, same keyring: the next program reads it
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        serial = libc.syscall(250, 10, ctypes.c_long(-4), b"user", name.encode(), 0)
        libc.syscall(250, 21, ctypes.c_long(serial))  # KEYCTL_INVALIDATE: leave the host's keyring clean
    else:
        assert second.status == "fail", second.detail


# ------------------------------------------------------------------ survivors
def _scorer(program: str, marker: str, guard: str) -> subprocess.Popen:
    """A process that scores ``program`` (as a trainer's reward worker does); its stdin carries the
    script, so the marker is on no command line but the program's own children's."""
    iso = "Isolation.none()" if guard == "off" else "None"
    script = (f"import sys\nsys.path[:0] = {sys.path!r}\nfrom ibpo_lit.rewards import run_tests\n"
              "from ibpo_lit.rewards.sandbox.isolation import Isolation\n"
              f"run_tests({program!r}, ['assert f() == 1'], remote=('f',), timeout_s=60, isolation={iso})\n")
    proc = subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE)
    proc.stdin.write(script.encode())
    proc.stdin.close()
    return proc


@pytest.mark.parametrize("guard", ["off", "on"])
def test_nothing_survives_a_sigkilled_scorer(guard, isolated):
    marker = f"ibpo-survivor-{secrets.token_hex(4)}"
    # The program clears its parent-death signal and leaves a daemon in a session of its own.
    program = (
        "import ctypes, os, subprocess, time\n"
        "ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\n"
        f"subprocess.Popen(['sh', '-c', 'sleep 1000; true', '{marker}'], start_new_session=True)\n"
        "time.sleep(1000)\n"
    )
    scorer = _scorer(program, marker, guard)
    try:
        deadline = time.monotonic() + 30
        while not _processes_naming(marker):
            assert time.monotonic() < deadline and scorer.poll() is None, "the program never started"
            time.sleep(0.05)
    finally:
        scorer.kill()
        scorer.wait()
    time.sleep(2)  # the bound: nothing of the run alive 2 s after its scorer died
    left = _processes_naming(marker)
    for pid in left:
        os.kill(pid, 9)
    if guard == "off":
        assert left, "without namespaces the daemon outlives the scorer (the attack works)"
    else:
        assert not left, "a process of the run outlived the SIGKILLed scorer"
        for parent in isolated.cgroups.values():  # nor a cgroup: the scorer's reaper removed them
            assert not [d for d in os.listdir(parent) if d.startswith(f"{scorer.pid}-")], parent


# ------------------------------------------------------------------ trust in the data
def test_tests_run_in_the_judge_as_an_unprivileged_user(isolated):
    # A poisoned data file's test runs in the judge: as root it could write anywhere.
    tests = ["assert f() == 1", "assert os.getuid() != 0"]
    assert run_tests("def f():\n    return 1\n", tests, prelude="import os", remote=("f",), isolation=NONE).tests \
        == ("pass", "fail")  # guard off: the judge is root
    assert run_tests("def f():\n    return 1\n", tests, prelude="import os", remote=("f",)).status == "pass"


@pytest.mark.parametrize("guard", ["off", "on"])
def test_host_files_are_out_of_sight(guard, isolated):
    program = ("import os\n"
               f"def read():\n    return open({str(CHECKOUT_FILE)!r}).read()[:3]\n"
               "def site():\n    import sys\n    return os.listdir(sys.base_prefix + '/lib/python3.11/site-packages')\n")
    tests = ["assert read() == '\"\"\"'", "assert len(site()) > 0"]
    r = run_tests(program, tests, remote=("read", "site"), isolation=NONE if guard == "off" else isolated)
    assert r.tests == (("pass", "pass") if guard == "off" else ("error", "fail")), r.detail


def test_a_non_assert_test_line_is_refused_at_load(tmp_path):
    from ibpo_lit.data.code_tasks import load_mbpp
    from ibpo_lit.data.records import BadRecordError

    row = {"task_id": 700, "text": "Add two numbers.", "code": "def add(a, b):\n    return a + b\n",
           "test_list": ["assert add(1, 2) == 3", "add(1, 2)"], "test_setup_code": "", "challenge_test_list": []}
    path = tmp_path / "mbpp.jsonl"
    path.write_text(__import__("json").dumps(row) + "\n")
    # Guard off: the line loads, and a program that returns anything passes it.
    (task,) = load_mbpp(path, allow_non_assert=True)
    with SandboxPool(num_workers=1) as pool:
        (r,) = pool.run([("def add(a, b):\n    return 0\n", task.gold)])
    assert r.tests == ("fail", "pass")
    with pytest.raises(BadRecordError, match=r"mbpp.jsonl:1: field 'test_list': test 1 is not an assert"):
        load_mbpp(path)
    assert CodeTests.from_gold(task.gold).tests[1] == "add(1, 2)"
