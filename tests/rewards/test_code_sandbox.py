"""The code sandbox: scores, statuses, gold strings, values across the pipe, stdin tests, pools."""
import json
import math
import os
import time

import pytest

from ibpo_lit.rewards import (
    REWARDS,
    CodeTests,
    RewardPool,
    SandboxError,
    SandboxPool,
    code_reward,
    code_score,
    get_reward,
    run_tests,
)
from ibpo_lit.rewards.code import detect_isolation, probe
from ibpo_lit.rewards.sandbox.isolation import Isolation, SandboxUnavailable
from ibpo_lit.tasks import scoring_pool
from ibpo_lit.rewards.sandbox.judge import free_names, module_names, outputs_match
from ibpo_lit.rewards.sandbox.wire import (
    WireError,
    decode,
    encode,
    read_frame,
    write_frame,
)

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-4, 9) == 5", "assert add('a', 'b') == 'ab'"]
ENTRY = {"remote": ("add",)}


# ------------------------------------------------------------------ scores and statuses
def test_pass_fail_and_fraction():
    r = run_tests(ADD, ADD_TESTS, **ENTRY)
    assert (r.passed, r.total, r.status, r.tests) == (3, 3, "pass", ("pass", "pass", "pass"))
    assert r.fraction == 1.0 and r.seconds < 5 and r.run_id
    # a + b + 1 fails the two int tests and raises on the str test: 0 of 3, first non-pass is "fail"
    r = run_tests("def add(a, b):\n    return a + b + 1\n", ADD_TESTS, **ENTRY)
    assert (r.passed, r.status, r.tests) == (0, "fail", ("fail", "fail", "error"))
    assert code_score("def add(a, b):\n    return a + b if isinstance(a, int) else 'x'\n", ADD_TESTS, **ENTRY) == 2 / 3


def test_markdown_completion_is_extracted():
    completion = f"Here it is:\n```python\n{ADD}```\nThat should work. ```\nnot code\n```"
    assert code_score(completion, ADD_TESTS, **ENTRY) == 1.0
    assert code_score(completion, ADD_TESTS, extract=False, **ENTRY) == 0.0  # the raw text does not compile


@pytest.mark.parametrize(
    "program, status",
    [
        ("def add(a, b) return a\n", "error"),  # syntax error
        ("raise RuntimeError('at import')\n", "error"),
        ("def other():\n    pass\n", "error"),  # no add: NameError in every test
        ("def add(a, b):\n    raise ValueError('no')\n", "error"),
        ("def add(a, b):\n    return bytearray(8 << 30)\n", "memory"),
        ("def add(a, b):\n    while True:\n        pass\n", "timeout"),
    ],
)
def test_statuses(program, status):
    r = run_tests(program, ADD_TESTS, timeout_s=1.5, **ENTRY)
    assert (r.passed, r.status) == (0, status), r.detail


def test_stop_at_first_failure_counts_the_rest_as_not_run():
    r = run_tests("def add(a, b):\n    return 3\n", ADD_TESTS, stop_at_first_failure=True, **ENTRY)
    assert r.tests == ("pass", "fail", "not_run") and r.passed == 1


def test_broken_tests_are_unscorable_not_zero():
    with pytest.raises(SandboxError, match="bad prelude, setup or tests"):
        run_tests(ADD, ["assert add(1, 2) =="], **ENTRY)
    assert code_score(ADD, ["assert add(1, 2) =="], **ENTRY) is None
    with pytest.raises(ValueError, match="tests must not be empty"):
        run_tests(ADD, [], **ENTRY)
    # A name nothing defines is the tests' fault, found before the program runs.
    with pytest.raises(SandboxError, match=r"names that .* define.*\['Fraction'\]"):
        run_tests(ADD, ["assert add(1, 2) == Fraction(3, 1)"], **ENTRY)
    with pytest.raises(ValueError, match="need `remote`"):
        run_tests(ADD, ADD_TESTS)


# ------------------------------------------------------------------ gold strings and the reward
def test_gold_roundtrip_and_validation():
    spec = CodeTests(tests=ADD_TESTS, setup="x = 1", suffix="import math", prelude="import math", remote=("add",),
                     timeout_s=3.0)
    assert CodeTests.from_gold(spec.to_gold()) == spec
    assert json.loads(spec.to_gold())["v"] == 3
    for version in (1, 2):
        old = json.loads(spec.to_gold()) | {"v": version}
        with pytest.raises(ValueError, match=f"format {version} .* rebuild it"):
            CodeTests.from_gold(json.dumps(old))
    with pytest.raises(ValueError, match="not entry points"):
        CodeTests(tests=ADD_TESTS, remote=("add",), classes=("Solution",))
    with pytest.raises(ValueError, match="kind must be one of"):
        CodeTests(kind="java", tests=ADD_TESTS)
    with pytest.raises(ValueError, match="stdin tests must be"):
        CodeTests(kind="stdin", tests=["assert 1"])
    for bad in ("not json", "[1]", '{"tests": ["assert 1"]}', '{"v": 3, "tests": ["assert 1"], "oops": 1}'):
        with pytest.raises(ValueError):
            CodeTests.from_gold(bad)


def test_code_reward_is_registered_and_binary_by_default():
    assert get_reward("code") is code_reward is REWARDS["code"]
    gold = CodeTests(tests=ADD_TESTS, **ENTRY).to_gold()
    half = "def add(a, b):\n    return a + b if isinstance(a, int) else 'x'\n"
    assert code_reward(ADD, gold) == 1.0
    assert code_reward(half, gold) == 0.0  # METHOD.md: 1 correct, 0 wrong
    assert code_reward(half, CodeTests(tests=ADD_TESTS, reward="fraction", **ENTRY).to_gold()) == 2 / 3
    assert code_reward(ADD, "not a gold") is None


def test_code_reward_runs_in_the_sandbox_pool_with_one_clock():
    gold = CodeTests(tests=ADD_TESTS, **ENTRY).to_gold()
    pool = scoring_pool("code", num_workers=1)
    try:
        assert pool.score([(ADD, gold), ("def add(a, b):\n    return 0\n", gold)]) == [1.0, 0.0]
        # a slow wrong program runs out its own limit: 0 (timeout), never unscorable
        slow = CodeTests(tests=ADD_TESTS, timeout_s=1.0, **ENTRY).to_gold()
        assert pool.score([("def add(a, b):\n    while True:\n        pass\n", slow)]) == [0.0]
    finally:
        pool.close()
    # a worker pool's timeout would be a second, shorter clock around the sandbox's: refused
    with pytest.raises(ValueError, match="SandboxPool"):
        RewardPool("code", num_workers=1, timeout_s=60)


# ------------------------------------------------------------------ what crosses the pipe
def test_values_handles_and_shadowed_builtins():
    program = (
        "import collections\n"
        "class Box:\n    def __init__(self, v):\n        self.v = v\n        self.items = [v, v]\n"
        "    def __len__(self):\n        return 2\n    def __str__(self):\n        return f'Box({self.v})'\n"
        "def make(v):\n    return Box(v)\n"
        "def gen(n):\n    yield from range(n)\n"
        "def counts(s):\n    return collections.Counter(s)\n"
        "def big():\n    return 3 ** 200, float('inf'), {(1, 2): frozenset({b'x'})}, 1 + 2j\n"
        "def sum(a, b):\n    return a * b\n"  # shadows the builtin, as MBPP task 126 does
        "def fill(box):\n    box.v = 7\n    return box\n"
    )
    tests = [
        "assert list(gen(3)) == [0, 1, 2]",
        "assert counts('aab') == {'a': 2, 'b': 1}",
        "assert big() == (3 ** 200, float('inf'), {(1, 2): frozenset({b'x'})}, 1 + 2j)",
        "b = Box(4)\nassert b.v == 4 and b.items == [4, 4] and len(b) == 2 and str(b) == 'Box(4)'",
        "b = Box(1)\nb.v = 9\nfill(b)\nassert b.v == 7",
        "b = make(1)\nassert b is b and b in [b] and len({b: 1, make(2): 2}) == 2",  # the judge's identity
        "assert len(make(4)) == 2 and str(make(4)) == 'Box(4)'",  # asks nothing of the test's: allowed
        "assert sum(3, 4) == 12",
        "assert math.isclose(sum(0.5, 0.5), 0.25)",  # math: the judge's own module
    ]
    r = run_tests(program, tests, remote=("gen", "counts", "big", "make", "fill", "sum", "Box"), classes=("Box",))
    assert r.tests == ("pass",) * len(tests), r.detail
    # A value that stays in the program cannot be compared: such a test fails, whatever its ==.
    compared = ["assert make(1) == make(1)", "assert make(1) != make(2)", "assert make(1) != 1"]
    assert run_tests(program, compared, remote=("make",)).tests == ("fail",) * 3


def test_setup_runs_in_the_judge_on_the_programs_classes():
    program = "class Node:\n    def __init__(self, v):\n        self.v, self.left = v, None\n" \
              "def depth(n):\n    return 0 if n is None else 1 + depth(n.left)\n"
    setup = "root = Node(1)\nroot.left = Node(2)\nroot.left.left = Node(3)\n"
    r = run_tests(program, ["assert depth(root) == 3", "assert helper(2) == 4"], setup=setup,
                  prelude="def helper(x):\n    return x * 2\n", remote=("Node", "depth"), classes=("Node",))
    assert r.tests == ("pass", "pass"), r.detail


def test_program_exceptions_keep_their_builtin_type():
    program = "def parse(s):\n    return int(s)\n"
    tests = ["try:\n    parse('x')\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError"]
    assert run_tests(program, tests, remote=("parse",)).status == "pass"


# ------------------------------------------------------------------ stdin tests
STDIN_TESTS = [{"input": "3\n1 2 3\n", "output": "6\n"}, {"input": "2\n5 5\n", "output": "10"}]


def test_stdin_program():
    program = "n = int(input())\nprint(sum(map(int, input().split())))\n"
    assert run_tests(program, STDIN_TESTS, kind="stdin").status == "pass"
    fd0 = "import sys\nd = sys.stdin.buffer.read().split()\nsys.stdout.write(str(sum(map(int, d[1:]))) + '\\n')\n"
    assert run_tests(fd0, STDIN_TESTS, kind="stdin").status == "pass"
    wrong = run_tests("input()\nprint(6)\n", STDIN_TESTS, kind="stdin")
    assert wrong.tests == ("pass", "fail")
    crash = run_tests("raise SystemExit(3)\n", STDIN_TESTS, kind="stdin", stop_at_first_failure=True)
    assert crash.tests == ("error", "not_run") and crash.status == "error"


def test_stdin_output_is_capped_and_loops_time_out():
    flood = run_tests("while True:\n    print('x' * 4096)\n", STDIN_TESTS[:1], kind="stdin", timeout_s=5)
    assert flood.status == "fail" and "output limit" in flood.detail
    start = time.monotonic()
    loop = run_tests("while True:\n    pass\n", STDIN_TESTS, kind="stdin", timeout_s=1.0)
    assert loop.tests == ("timeout", "not_run") and time.monotonic() - start < 6


@pytest.mark.parametrize(
    "got, expected, same",
    [
        ("6\n", "6", True),
        ("  1 2 \n3\n\n", "1 2\n3", True),
        ("1.50\n", "1.5\n", True),  # decimals compared as numbers
        ("1.5000001\n", "1.5\n", False),
        ("1\n2\n", "1\n", False),
        ("abc\n", "abd\n", False),
    ],
)
def test_outputs_match(got, expected, same):
    assert outputs_match(got, expected) is same


# ------------------------------------------------------------------ pool
def test_sandbox_pool_counts_statuses_and_keeps_order():
    gold = CodeTests(tests=ADD_TESTS, timeout_s=1.5, **ENTRY).to_gold()
    pairs = [
        (ADD, gold),
        ("def add(a, b):\n    return 0\n", gold),
        ("def add(a, b):\n    while True:\n        pass\n", gold),
        ("x = bytearray(8 << 30)\n", gold),
        ("def add(a, b) return\n", gold),
        (ADD, "not a gold"),
        (ADD, gold),
    ]
    with SandboxPool(num_workers=2) as pool:
        start = time.monotonic()
        results = pool.run(pairs)
        assert time.monotonic() - start < 15
        assert [r.status if r else None for r in results] == ["pass", "fail", "timeout", "memory", "error", None, "pass"]
        assert dict(pool.stats) == {"pass": 2, "fail": 1, "timeout": 1, "memory": 1, "error": 1, "unscorable": 1}
        assert pool.score(pairs[:2]) == [1.0, 0.0]
        assert pool.submit(ADD, gold).result().status == "pass"


# ------------------------------------------------------------------ the wire and the judge's helpers
def test_wire_roundtrip_gives_exact_builtin_types():
    class MyInt(int):
        def __eq__(self, other):
            return True

    value = [None, True, MyInt(5), 2 ** 100, -(2 ** 70), math.inf, "é", (1, [2]), {3}, frozenset({4}),
             {"k": {(1, 2): b"\x00"}}, bytearray(b"ab"), 1j]
    back = decode(encode(value, _no_other), _no_ref)
    assert back == value and type(back[2]) is int and back[2] != 6
    with pytest.raises(TypeError):
        encode(object(), _no_other)
    for bad in ([1], {"zz": 1}, {"l": 1}, {"i": "xyz"}, {"d": [[[1], 2]]}):
        with pytest.raises(WireError):
            decode(bad, _no_ref)


def test_decoding_is_bounded_in_items_and_depth():
    from ibpo_lit.rewards.sandbox.wire import MAX_DEPTH

    flat = encode(list(range(100)), _no_other)
    assert decode(flat, _no_ref, max_items=101) == list(range(100))  # the list itself is an item
    with pytest.raises(WireError, match="too many items"):
        decode(flat, _no_ref, max_items=100)
    nested = []
    for _ in range(MAX_DEPTH + 1):
        nested = [nested]
    with pytest.raises(WireError, match="nested deeper"):
        decode(encode(nested, _no_other), _no_ref)


def test_frames_refuse_oversize():
    r, w = os.pipe()
    try:
        write_frame(w, {"l": ["x" * 100]})
        with pytest.raises(WireError, match="exceeds the limit"):
            read_frame(r, 50)
    finally:
        os.close(r)
        os.close(w)


def test_free_and_module_names():
    import ast

    tree = ast.parse("import os\nassert f(x) == math.pi\nfor i in range(3):\n    g(i)\ndef h(y):\n    return y\nh(z)")
    assert free_names(tree) == {"f", "x", "math", "range", "g", "z"}
    assert module_names(tree) == {"math"}


def _no_other(obj):
    raise TypeError(type(obj).__name__)


def _no_ref(tag, value, data):
    raise WireError(tag)


# ------------------------------------------------------------------ isolation
def test_without_os_isolation_the_verdict_is_still_the_judges():
    iso = Isolation.none()
    assert any("no namespaces" in gap for gap in iso.gaps)
    assert run_tests(ADD, ADD_TESTS, isolation=iso, **ENTRY).status == "pass"
    r = run_tests("class E:\n    def __eq__(self, o):\n        return True\ndef add(a, b):\n    return E()\n",
                  ADD_TESTS, isolation=iso, timeout_s=2, **ENTRY)
    assert r.passed == 0
    looping = run_tests("def add(a, b):\n    while True: pass\n", ADD_TESTS, isolation=iso, timeout_s=1, **ENTRY)
    assert looping.status == "timeout"


def _slow_start(seconds: float) -> Isolation:
    """No OS isolation, and a start-up delayed by ``seconds``: a launcher before the sandbox's
    interpreter sleeps, then runs it (a loaded machine, made exact)."""
    return Isolation.none(launcher=("/bin/sh", "-c", f'sleep {seconds}; exec "$@"', "sh"))


def test_a_slow_start_is_not_the_programs_time():
    # Start-up (2 s) longer than the program's limit (1 s): the limit starts when the sandbox is ready.
    r = run_tests(ADD, ADD_TESTS, isolation=_slow_start(2), timeout_s=1, **ENTRY)
    assert r.status == "pass", r.detail
    assert r.seconds >= 2  # the delay really happened
    looping = run_tests("def add(a, b):\n    while True: pass\n", ADD_TESTS, isolation=_slow_start(2), timeout_s=1,
                        **ENTRY)
    assert looping.status == "timeout"  # and the program's own limit still holds


def test_every_stdin_sandboxs_start_is_not_the_programs_time():
    # Four stdin tests, each in its own sandbox that takes 0.6 s to start, under a 1 s limit: the
    # program's clock pauses while each starts (before, the later starts were charged to it).
    program = "print(sum(map(int, open(0).read().split()[1:])))\n"
    tests = [{"input": f"2\n{i} {i}\n", "output": f"{2 * i}\n"} for i in range(4)]
    r = run_tests(program, tests, kind="stdin", isolation=_slow_start(0.6), timeout_s=1, extract=False)
    assert r.status == "pass" and r.seconds >= 2.4, (r.status, r.detail, r.seconds)
    looping = run_tests("while True:\n    pass\n", tests, kind="stdin", isolation=_slow_start(0.6), timeout_s=1,
                        extract=False)
    assert looping.status == "timeout"


def test_a_sandbox_that_never_starts_is_the_judges_failure():
    from ibpo_lit.rewards.sandbox.judge import START_LIMIT_S

    with pytest.raises(SandboxError, match=f"did not start within {START_LIMIT_S:.0f} s"):
        run_tests(ADD, ADD_TESTS, isolation=_slow_start(START_LIMIT_S + 1), timeout_s=1, **ENTRY)


def test_an_unusable_sandbox_is_a_clear_error():
    broken = Isolation(bwrap="/bin/false")  # a bwrap that cannot create anything
    with pytest.raises(SandboxUnavailable, match="cannot run on this host.*bubblewrap.*docs/sandbox.md"):
        probe(broken)


def _sandbox_uids(run) -> set[int]:
    """The host's uids of this process's sandboxed programs (not their judges), seen from the host
    while ``run()`` is under way."""
    import threading

    seen, done = set(), threading.Event()

    def watch():
        while not done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cgroup") as f:
                        cgroups = f.read()
                    with open(f"/proc/{pid}/status") as f:
                        status = f.read()
                except OSError:
                    continue
                if f"ibpo_sandbox/{os.getpid()}-" in cgroups and "-judge" not in cgroups:
                    seen.add(int(status.split("Uid:")[1].split()[0]))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run()
    finally:
        done.set()
        watcher.join()
    return seen


@pytest.mark.skipif(os.geteuid() != 0, reason="the per-run uid needs root")
def test_detected_isolation_as_root():
    from ibpo_lit.rewards.sandbox.box import SANDBOX_UID

    iso = detect_isolation()
    assert iso.bwrap and iso.per_run_uid
    if "pids" not in iso.cgroups:
        pytest.skip("the sandbox's processes are found on the host by their pids cgroup")
    program = ("import os, time\n"
               "def who():\n    return os.getuid(), os.getgid(), os.getgroups(), os.getcwd(), sorted(os.environ)\n"
               "def proc():\n    return os.path.exists('/proc')\n"
               "def root():\n    return sorted(os.listdir('/'))\n"
               "def hold():\n    time.sleep(1.0)\n    return 1\n")
    tests = [f"assert who()[:4] == ({SANDBOX_UID}, {SANDBOX_UID}, [], '/tmp')",
             "assert set(who()[4]) - {'LD_LIBRARY_PATH'} == {'HOME', 'LANG', 'LC_ALL', 'OMP_NUM_THREADS', 'PATH', "
             "'PWD', 'PYTHONHASHSEED', 'PYTHONSAFEPATH'}",
             "assert not proc()",  # no /proc: nothing of bwrap's or the mounts' sources (test_sandbox_host.py)
             "assert set(root()) <= {'bin', 'dev', 'etc', 'lib', 'lib32', 'lib64', 'libx32', 'opt', 'sbin', 'tmp', "
             "'usr'}",
             "assert hold() == 1"]
    uids = []
    for _ in range(2):
        results = []
        seen = _sandbox_uids(lambda: results.append(
            run_tests(program, tests, remote=("who", "proc", "root", "hold"))))
        assert results[0].tests == ("pass",) * 5, results[0].detail
        assert len(seen) == 1 and min(seen) >= 2 ** 20, seen  # the host's uid: the run's own
        uids.append(seen.pop())
    assert uids[0] != uids[1]  # a fresh uid per run: no kernel state keyed by uid carries over


def test_training_and_evaluation_score_code_with_one_pool():
    from ibpo_lit.tasks import scoring_pool
    from ibpo_lit.rewards.pool import RewardPool

    gold = CodeTests(tests=ADD_TESTS, timeout_s=1.5, **ENTRY).to_gold()
    pool = scoring_pool("code", num_workers=2)
    try:
        assert isinstance(pool, SandboxPool)  # what evaluation's score_samples runs code with
        looping = "def add(a, b):\n    while True:\n        pass\n"
        assert pool.score([(ADD, gold), (looping, gold), (ADD, "not a gold")]) == [1.0, 0.0, None]
        # a program's timeout is its 0; only the harness's failure is unscorable
        assert pool.unscorable == {"timeout": 0, "error": 0, "none": 1}
    finally:
        pool.close()
    math_pool = scoring_pool("math", num_workers=1, timeout_s=5)
    try:
        assert isinstance(math_pool, RewardPool) and math_pool.unscorable == {"timeout": 0, "error": 0, "none": 0}
    finally:
        math_pool.close()


def test_a_new_trainer_removes_only_the_groups_of_callers_that_are_gone(tmp_path, monkeypatch):
    """`_remove_stale`: the cgroups named for a process that has exited are removed; those of a
    live caller, and anything not named ``<pid>-...``, are left alone (before, the suite covered
    this only when an earlier run happened to leave a group behind)."""
    import subprocess
    import sys

    from ibpo_lit.rewards.sandbox import isolation

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for name in (f"{gone.pid}-run", f"{gone.pid}-run-judge", f"{os.getpid()}-run", "scratch"):
        (tmp_path / name).mkdir()
    (tmp_path / f"{gone.pid}-file").write_text("")  # not a group
    removed = []
    monkeypatch.setattr(isolation, "remove_cgroup", lambda path, wait_s=2.0: removed.append(os.path.basename(path)))
    isolation._remove_stale(str(tmp_path))
    assert sorted(removed) == [f"{gone.pid}-run", f"{gone.pid}-run-judge"]
