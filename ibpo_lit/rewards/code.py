"""Code rewards: run a program against tests in a sandbox; the score is the fraction that passed.

Three processes per run. The caller (`run_tests`, in the trainer or a pool thread) starts a
*judge*, a fresh trusted interpreter (``python -I -S``, never a fork of the trainer), which starts
the *sandbox*, a fresh interpreter that confines itself and then loads the untrusted program
(files: ``sandbox/judge.py``, ``sandbox/box.py``, ``sandbox/child.py``, ``sandbox/wire.py``).

How a test result is made unforgeable:
- The tests run in the judge, not next to the program. For ``assert`` tests the judge evaluates
  each assert itself; the names it needs from the program (the function under test) are proxies,
  and every call is a request over a pipe whose reply is decoded as plain data (int, str, list,
  dict, ... never an object with the program's ``__eq__``) or a handle to an object that stays in
  the program. The expected values never leave the judge, so no print, exit code, patched
  builtin, rewritten harness or ``__eq__`` that returns True can pass a test: the program has to
  return the right value. The program's replies are data only: the judge takes from them just
  the names it asked for (so a forged reply cannot replace a trusted helper of the prelude), and
  a StopIteration raised in the program reaches the tests as an ordinary error (so it cannot end
  an ``all(map(...))`` early). ``stdin`` tests compare the program's stdout with an expected
  output the program never sees.
- The verdict travels on the judge's stdout, which the sandbox cannot reach: it runs as another
  uid (65534) in its own PID namespace, and holds only its two request pipes.

How the sandbox is contained (as far as `detect_isolation` finds the OS allows; every gap is
logged once as a warning):
- Network: a fresh network namespace (``unshare --net``), so no interface but a down loopback
  (also no abstract Unix sockets of the host; filesystem sockets are guarded by file permissions).
- Processes: a PID namespace whose init is the program (its death kills all it started), a
  ``pids`` cgroup (``max_processes``), RLIMIT_NPROC as uid 65534 (root ignores it), a new session;
  on timeout the judge SIGKILLs the namespace, and parent-death signals chain caller -> judge ->
  sandbox, so nothing outlives a killed trainer.
- Memory: RLIMIT_AS and a ``memory`` cgroup (``memory_mb``); CPU: RLIMIT_CPU and the wall-clock
  deadline; disk: RLIMIT_FSIZE, and /tmp, /var/tmp, /dev/shm, /run/lock replaced by one small
  tmpfs (``tmpfs_mb``) that vanishes with the namespace; 256 open files; no core dumps.
- Files and other processes: uid/gid 65534 with no supplementary groups and no new privileges;
  an empty environment (PATH, LANG, HOME); stdin closed (``assert``) or the test input
  (``stdin``); the program's output discarded (``assert``) or capped (``stdin``).

Status of a run: "pass" (all tests passed), "fail", "timeout", "memory", "error" (could not be
loaded, crashed, or a test raised); see `CodeResult`. A failure of the harness itself (the judge
crashed, the sandbox could not start, the tests do not compile) raises `SandboxError`, and
`code_score` / `code_reward` return None: unscorable, never a silent 0.

The gold string of ``REWARDS["code"]`` is `CodeTests.to_gold()`: JSON with ``kind``, ``tests``,
``setup``, ``prefix``, ``prelude``, ``remote``, ``timeout_s``, ``memory_mb``,
``stop_at_first_failure`` and ``reward`` ("all": 1.0 only when every test passes, the binary
reward of METHOD.md section 1; "fraction": the fraction passed).

What is not covered:
- Values the judge cannot see inside: a result that is not plain data (an instance of the
  program's class, a generator) is a handle that equals only itself; `list(...)`, ``len``,
  ``str``, attributes and items of it are fetched. Arguments are copied, so a test that checks
  that the program mutated its argument in place fails. The program's globals are looked up
  once, after loading. Judge-side callables (lambdas) cannot be passed to the program.
- A program that knows the expected values (MBPP prompts show three of the asserts) can return
  them: that is memorising the tests, which no sandbox prevents.
- Only the standard library is importable in the sandbox (``-S``: no site-packages).
- Weak tests: ``assert f(x)`` (truthiness) passes for any truthy value, as it would anywhere.
- Kernel exploits, side channels, and CPU shares (cgroup ``cpu`` is not used; a program may use
  up to ``max_processes`` CPUs until its deadline).
- Speed: two interpreter starts per run (judge and sandbox), about 0.1-0.2 s, and one sandbox
  per test case for ``stdin`` tests.
- Windows and macOS.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from ibpo_lit.rewards.sandbox.isolation import Isolation, detect_isolation, remove_cgroup

logger = logging.getLogger(__name__)

STATUSES = ("pass", "fail", "timeout", "memory", "error")
KINDS = ("assert", "stdin")
REWARD_MODES = ("all", "fraction")
DEFAULT_TIMEOUT_S = 10.0  # per program, load and all tests together
DEFAULT_MEMORY_MB = 1024
JUDGE_GRACE_S = 10.0  # the caller's kill of the judge: its own deadline plus start-up (<= 5 s) and cleanup
_LIMITS = {"tmpfs_mb": 64, "file_size_mb": 16, "max_processes": 64, "max_output_bytes": 8 << 20,
           "max_frame": 64 << 20}
_SANDBOX_DIR = Path(__file__).with_name("sandbox")
_run_counter = itertools.count()


class SandboxError(RuntimeError):
    """The harness could not score the program (not the program's fault)."""


@dataclass(frozen=True)
class CodeTests:
    """The tests of one problem, and how to run them: what a code gold string encodes.

    Args:
        kind: "assert" (each test is Python source run by the judge; typically one ``assert``) or
            "stdin" (each test is ``{"input": str, "output": str}``; the program reads stdin).
        tests: The tests, in order.
        setup: Source run in the program after it (MBPP's ``test_setup_code``, which builds
            objects from the program's classes).
        prefix: Source run in the program before it (HumanEval's prompt; LiveCodeBench's imports).
        prelude: Trusted source run in the judge before the tests (imports, helpers).
        remote: Names the tests must take from the program even when the judge has them (the
            function under test; HumanEval's entry point, which the prelude defines as a stub).
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
    prelude: str = ""
    remote: tuple[str, ...] = ()
    timeout_s: float | None = None
    memory_mb: int | None = None
    stop_at_first_failure: bool = False
    reward: str = "all"

    def __post_init__(self) -> None:
        object.__setattr__(self, "tests", tuple(self.tests))
        object.__setattr__(self, "remote", tuple(self.remote))
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {self.reward!r}")
        if not self.tests:
            raise ValueError("tests must not be empty")
        if self.kind == "assert" and not all(isinstance(t, str) for t in self.tests):
            raise ValueError("assert tests must be strings of Python source")
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
        """The gold string for ``REWARDS["code"]`` (JSON)."""
        return json.dumps({"v": 1, **asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_gold(cls, gold: str) -> CodeTests:
        """Parse a gold string made by `to_gold`.

        Raises:
            ValueError: not a code gold string (the message says why).
        """
        try:
            obj = json.loads(gold)
        except json.JSONDecodeError as e:
            raise ValueError(f"code gold is not JSON: {e.msg}") from None
        if not isinstance(obj, dict) or obj.pop("v", None) != 1:
            raise ValueError("code gold must be a JSON object with \"v\": 1 (see CodeTests.to_gold)")
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

    @property
    def fraction(self) -> float:
        return self.passed / self.total


# ------------------------------------------------------------------ code extraction
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3", "py3"}


def extract_code(text: str) -> str:
    """The program in a model's response.

    The text after the last ``</think>`` (a reasoning model's scratchpad is not the answer); in
    it, the last fenced block tagged python (``python``, ``py``, ``python3``), else the last
    untagged fenced block, else the whole text. An unclosed final fence (a truncated response)
    runs to the end of the text.
    """
    text = text.rsplit("</think>", 1)[-1]
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
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


def _program(prefix: str, code: str, setup: str) -> list[list[str]]:
    """The program's parts, run in order in one namespace. The prefix is joined to the code as
    one source, so a completion may continue it (HumanEval: a bare function body)."""
    if prefix and not prefix.endswith("\n"):
        prefix += "\n"
    parts = [["solution", prefix + code]]
    if setup:
        parts.append(["setup", setup])
    return parts


def run_code_tests(completion: str, spec: CodeTests, *, extract: bool = True,
                   isolation: Isolation | None = None) -> CodeResult:
    """`run_tests` for a `CodeTests` (what a gold string decodes to)."""
    iso = isolation if isolation is not None else detect_isolation()
    code = extract_code(completion) if extract else completion
    timeout_s = spec.timeout_s or DEFAULT_TIMEOUT_S
    run_id = f"{os.getpid()}-{next(_run_counter)}-{secrets.token_hex(4)}"
    judge_src, child_src = _sources()
    payload = {
        **_LIMITS, "kind": spec.kind, "tests": list(spec.tests), "prelude": spec.prelude,
        "remote": list(spec.remote), "stop_at_first_failure": spec.stop_at_first_failure,
        "program": _program(spec.prefix, code, spec.setup),
        "timeout_s": timeout_s, "memory_mb": spec.memory_mb or DEFAULT_MEMORY_MB,
        "isolation": iso.as_spec(), "python": sys.executable, "child_src": child_src, "run_id": run_id,
    }
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", judge_src, str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/", start_new_session=True,
    )
    try:
        out, err = proc.communicate(json.dumps(payload).encode("utf-8", "surrogatepass"),
                                    timeout=timeout_s + JUDGE_GRACE_S)
    except BaseException:  # a stuck judge, or KeyboardInterrupt: leave nothing behind
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        for parent in iso.cgroups.values():
            remove_cgroup(os.path.join(parent, run_id))
        if sys.exc_info()[0] is subprocess.TimeoutExpired:
            raise SandboxError(f"judge did not finish within {timeout_s + JUDGE_GRACE_S:.0f} s") from None
        raise
    seconds = time.monotonic() - start
    try:
        result = json.loads(out)
    except json.JSONDecodeError:
        tail = err.decode("utf-8", "replace").strip()[-800:]
        raise SandboxError(f"judge failed (exit code {proc.returncode}): {tail}") from None
    if "infra_error" in result:
        raise SandboxError(result["infra_error"])
    return CodeResult(passed=result["passed"], total=result["total"], status=result["status"],
                      tests=tuple(result["tests"]), detail=result["detail"], seconds=seconds, run_id=run_id)


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
    """
    try:
        spec = CodeTests.from_gold(gold)
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
