"""Issue 32's attack classes (the third hidden set's), one test each; where a guard can be shown
off, the same attack with it off first.

* the program answering the judge's questions through handles (membership, methods, items);
* verdicts as large as the program wants;
* kernel state shared between runs and sandboxes (keyrings, inotify, locks) and the host's disk
  (a writable stdin file, ``fallocate``); tracing the sandbox's init;
* a missing entry point standing in for the prelude's stub; timeout layers that disagree.
"""
import ctypes
import os
import subprocess
import sys

import pytest

from ibpo_lit.rewards import run_tests
from ibpo_lit.rewards.code import SandboxError
from ibpo_lit.rewards.sandbox.box import DENIED_FCNTL, DENIED_SYSCALLS, seccomp_filter


# ------------------------------------------------------------------ values, not handles
ANSWERS_YES = (
    "class Yes:\n"
    "    def __contains__(self, x):\n        return True\n"
    "    def __getitem__(self, k):\n        return k\n"
    "    def startswith(self, y):\n        return True\n"
    "    def count(self, y):\n        return 3\n"
    "    def issuperset(self, y):\n        return True\n"
    "def f(x):\n    return Yes()\n"
)
ASKING = [
    "assert 'expected' in f(1)",
    "assert f(1).startswith('expected')",
    "assert f(1).count('expected') == 3",
    "assert f(1).issuperset({'expected'})",
    "assert f(1)['expected'] == 'expected'",
]


def test_a_returned_object_cannot_answer_the_tests_questions():
    r = run_tests(ANSWERS_YES, ASKING, remote=("f",))
    assert r.tests == ("fail",) * len(ASKING), r.detail
    assert "plain data" in r.detail


def test_with_the_guard_off_the_same_object_forges_every_test():
    # "off": the object's class declared as the task's class, as if the tests used its instances
    # on purpose (LiveCodeBench's Solution): its answers are then believed, documented as such.
    program = ANSWERS_YES + "def g(x):\n    return Yes()\n"
    tests = [t.replace("f(1)", "Yes()") for t in ASKING]
    r = run_tests(program, tests, remote=("Yes",), classes=("Yes",))
    assert r.tests == ("pass",) * len(ASKING), r.detail


def test_a_str_subclass_is_plain_data_with_the_judges_methods():
    program = "class S(str):\n    def startswith(self, y):\n        return True\ndef f(x):\n    return S('zzz')\n"
    r = run_tests(program, ["assert f(1).startswith('abc')", "assert f(1) == 'zzz'"], remote=("f",))
    assert r.tests == ("fail", "pass"), r.detail


def test_a_declared_class_still_works_as_its_tasks_need():
    program = ("class Solution:\n    def twoSum(self, nums, t):\n"
               "        return [i for i in range(len(nums)) for j in range(i) if nums[i] + nums[j] == t][:1] + [0]\n")
    tests = ["assert sorted(Solution().twoSum([2, 7], 9)) == [0, 1]"]
    assert run_tests(program, tests, remote=("Solution",), classes=("Solution",)).status == "pass"


def test_a_missing_entry_point_is_an_error_not_the_preludes_stub():
    prelude = "def f(x):\n    return x\n"  # HumanEval's prompt defines the function's stub
    r = run_tests("def g(x):\n    return x\n", ["assert f(2) == 2"], prelude=prelude, remote=("f",))
    assert r.status == "error" and "does not define f" in r.detail, r.detail


# ------------------------------------------------------------------ bounded verdicts
def test_a_reply_the_decoder_rejects_cannot_flood_the_verdict():
    # The program answers with a 10 MB tag: the decoder's message used to quote it whole.
    program = ("import sys\nmain = sys.modules['__main__']\n"
               "main.encode = lambda value, keep: {'Z' * 10_000_000: 1}\n"
               "def f(x):\n    return 1\n")
    r = run_tests(program, ["assert f(1) == 1"], remote=("f",))
    assert r.status in ("error", "fail") and len(r.detail) <= 1000, (r.status, len(r.detail))


def test_an_exception_as_large_as_the_program_wants_is_bounded():
    program = ("class E(Exception):\n    pass\n"
               "E.__name__ = 'E' * 5_000_000\n"
               "def f(x):\n    raise E('m' * 5_000_000)\n")
    r = run_tests(program, ["assert f(1) == 1"], remote=("f",))
    assert r.status == "error" and len(r.detail) <= 1000, (r.status, len(r.detail))


# ------------------------------------------------------------------ nothing shared
_SYSCALLS = (
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
    "def err(nr, *args):\n"
    "    return 0 if libc.syscall(nr, *[ctypes.c_long(a) for a in args]) >= 0 else ctypes.get_errno()\n"
    "def probe():\n"
    "    fd = os.open('/tmp/x', os.O_RDWR | os.O_CREAT)\n"
    "    usr = os.open('/usr', os.O_RDONLY)\n"
    "    return {\n"
    "        'keyctl': err(250, 0, -3, 0),\n"  # KEYCTL_GET_KEYRING_ID of the session keyring
    "        'add_key': err(248, 0, 0, 0, 0, -3),\n"
    "        'inotify_init1': err(294, 0),\n"
    "        'flock_host_inode': err(73, usr, 2),\n"  # LOCK_EX on /usr, bound from the host
    "        'fcntl_setown': err(72, fd, 8, os.getpid()),\n"
    "        'ptrace_init': err(101, 16, 1, 0, 0),\n"  # PTRACE_ATTACH to the namespace's init
    "        'fallocate': err(285, fd, 0, 0, 1 << 30),\n"
    "        'fcntl_getfl': err(72, fd, 3),\n"  # an ordinary fcntl still works
    "    }\n"
)
EXPECTED = {"keyctl": 1, "add_key": 1, "inotify_init1": 1, "flock_host_inode": 1, "fcntl_setown": 1,
            "ptrace_init": 1, "fallocate": 1, "fcntl_getfl": 0}


_JOIN_SESSION = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
                 "assert libc.syscall(250, 1, b'ibpo-test-session') > 0\n")  # KEYCTL_JOIN_SESSION_KEYRING


def _in_session_keyring(script: str, cwd: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a process that joined a fresh session keyring, as a container's or a PAM
    login's trainer has, from ``cwd``."""
    return subprocess.run([sys.executable, "-c", _JOIN_SESSION + script], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


@pytest.mark.parametrize("where", ["tmp", "home"])
def test_kernel_state_and_the_hosts_disk_are_out_of_reach(isolated, where, tmp_path):
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        pytest.skip("the probe uses x86_64 system call numbers")
    cwd = str(tmp_path) if where == "tmp" else os.path.expanduser("~")
    tests = [f"x = probe()\nassert x == {EXPECTED!r}, x"]
    script = ("from ibpo_lit.rewards import run_tests\n"
              f"r = run_tests({_SYSCALLS!r}, {tests!r}, remote=('probe',))\n"
              "print(r.status, r.detail)\n")
    done = _in_session_keyring(script, cwd)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("pass"), done.stdout


def test_stdin_is_a_sealed_memory_file(isolated):
    # (the sandbox has no /proc to read fd 0's name in: its seals say what it is)
    program = ("import fcntl, os, sys\n"
               "try:\n    os.write(0, b'x')\n    mode = 'rw'\nexcept OSError:\n    mode = 'ro'\n"
               "sealed = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL\n"
               "print(mode, fcntl.fcntl(0, fcntl.F_GET_SEALS) == sealed, sys.stdin.read().split()[-1])\n")
    r = run_tests(program, [{"input": "a b c\n", "output": "ro True c\n"}], kind="stdin", extract=False)
    assert r.status == "pass", r.detail


def test_the_filter_refuses_what_it_lists_and_other_abis():
    import struct

    rules = seccomp_filter("x86_64")
    instructions = [struct.unpack("=HBBI", rules[i:i + 8]) for i in range(0, len(rules), 8)]
    compared = {k for code, _, _, k in instructions if code == 0x15}
    assert {nr for nr, _ in DENIED_SYSCALLS.values()} <= compared  # x86_64's numbers
    assert set(DENIED_FCNTL.values()) <= compared
    assert instructions[1][3] == 0xC000003E and instructions[2] == (0x06, 0, 0, 0x00050001)  # i386: refused
    assert seccomp_filter("riscv64") is None and seccomp_filter("aarch64") != rules


# ------------------------------------------------------------------ neighbours
BUSY = ("import os\ndef f():\n    for _ in range(60):\n        if os.fork() == 0:\n            while True:\n"
        "                pass\n    while True:\n        pass\n")
CORRECT = "def g():\n    return sum(i * i for i in range(3_000_000)) % 7\n"  # ~0.3 s of one CPU


@pytest.fixture
def trainer_in_a_one_cpu_cgroup(isolated):
    """This process (the trainer) in a cpu cgroup capped at one CPU, with the sandboxes' groups
    nested in it, as a container's cgroup holds a trainer: the kernel's per-session autogroups,
    which share the CPU fairly between sandboxes on a bare host, do not apply inside a cgroup."""
    parent = isolated.cgroups.get("cpu")
    if parent is None:
        pytest.skip("no cpu cgroup")
    with open("/proc/self/cgroup") as f:
        home = next(line.split(":", 2)[2].strip() for line in f if "cpu" in line.split(":")[1].split(","))
    quota = os.path.join(parent, "cpu.cfs_quota_us")
    with open(quota) as f:
        before = f.read().strip()
    with open(os.path.join(parent, "cpu.cfs_period_us")) as f:
        period = f.read().strip()
    with open(quota, "w") as f:
        f.write(period)
    with open(os.path.join(parent, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    try:
        yield isolated
    finally:
        with open(os.path.join(os.path.dirname(parent), home.lstrip("/"), "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        with open(quota, "w") as f:
            f.write(before)


@pytest.mark.parametrize("guard", ["off", "on"])
def test_a_busy_neighbour_cannot_decide_a_correct_programs_verdict(trainer_in_a_one_cpu_cgroup, guard):
    import dataclasses
    import multiprocessing
    import time

    from ibpo_lit.rewards.sandbox.isolation import _remove_stale

    iso = trainer_in_a_one_cpu_cgroup
    if guard == "off":  # no per-run cpu groups: 61 busy processes and the correct program share one CPU
        iso = dataclasses.replace(iso, cgroups={k: v for k, v in iso.cgroups.items() if k != "cpu"})
    # The neighbour's limit is longer than the correct program's whole run can last (its judge's
    # start, slow beside 61 spinners, plus 3 s): with 15 s, a slow start once let the correct
    # program run after the neighbour's limit had ended it, and pass unguarded (CI, 2026-11-26).
    # It runs from a process of its own (forked: in this cgroup, with this isolation), ended
    # once the verdict is in: its sandbox dies with it (death signals, its PID namespace), and
    # the groups its runs made are removed here, as those of any caller that no longer exists
    # (the reaper watches this process, not that one).
    hostile = multiprocessing.get_context("fork").Process(
        target=run_tests, args=(BUSY, ["assert f() == 1"]),
        kwargs=dict(remote=("f",), timeout_s=40.0, isolation=iso, extract=False), daemon=True)
    hostile.start()
    time.sleep(2.0)  # its 60 processes are spinning
    try:
        r = run_tests(CORRECT, ["assert g() == sum(i * i for i in range(3_000_000)) % 7"], remote=("g",),
                      timeout_s=3.0, isolation=iso, extract=False)
    except SandboxError as e:  # its sandbox could not even start beside the neighbour: unscorable
        r = e
    finally:
        outlasted = hostile.is_alive()
        hostile.kill()
        hostile.join()
        for parent in iso.cgroups.values():
            _remove_stale(parent)
    assert outlasted, "the neighbour ended before the verdict: it did not outlast the run"
    if guard == "off":  # starved: a timeout (0), or no start at all (None)
        assert isinstance(r, SandboxError) or r.status == "timeout", r
    else:
        assert r.status == "pass", r


# ------------------------------------------------------------------ the conditions of a container
@pytest.mark.slow
def test_the_attack_suites_hold_under_load_from_a_checkout_in_tmp_in_a_session_keyring(isolated, tmp_path):
    """Both attack suites again, as a user's container would run them: the checkout under /tmp
    (the program's /tmp is its own tmpfs, the host's is not in sight), both cores busy with
    other work, and the trainer in a session keyring of its own."""
    import shutil
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    copy = tmp_path / "checkout"
    shutil.copytree(repo / "ibpo_lit", copy / "ibpo_lit", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tests" / "rewards").mkdir(parents=True)
    for name in ("conftest.py", "test_code_attacks.py", "test_code_attacks_round3.py"):
        shutil.copy(repo / "tests" / "rewards" / name, copy / "tests" / "rewards" / name)
    busy = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(2)]
    try:
        script = ("import sys, pytest\n"
                  "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/rewards', "
                  "'-k', 'not neighbour and not under_load']))\n")
        done = subprocess.run([sys.executable, "-c", _JOIN_SESSION + script], cwd=copy, capture_output=True,
                              text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(copy)})
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert str(copy).startswith(("/tmp", os.environ.get("TMPDIR", "/tmp"))) and " passed" in done.stdout


def test_every_malformed_value_is_a_wire_error_not_a_stray_exception():
    from ibpo_lit.rewards.sandbox.wire import WireError, decode

    def ref(tag, value, data):
        raise WireError("no references here")

    for bad in ({"c": []}, {"c": {"x": 1}}, {"c": [10 ** 400, 0]}, {"c": "ab"}, {"i": 5}, {"b": "zz"},
                {"d": [[{"l": []}, 1]]}, {"d": [[1]]}, {"l": 3}, {"?" * 10_000: 1}, [1]):
        with pytest.raises(WireError) as caught:
            decode(bad, ref)
        assert len(str(caught.value)) < 300
