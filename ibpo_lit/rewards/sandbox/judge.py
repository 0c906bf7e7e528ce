"""The judge: a trusted interpreter that runs the tests and decides each one.

Started by `ibpo_lit.rewards.code.run_tests` as ``python -I -S -c <wire.py + box.py + this file>
CALLER_PID`` with a JSON spec on stdin; writes one JSON result on stdout. Standard library only
(see wire.py). It never runs the program's code: it starts the sandbox (box.py, child.py) and
talks to it.

What is covered:
- ``assert`` tests: the prelude (trusted: imports, helpers such as HumanEval's ``poly``) and every
  test run *here*. The names a test reads that neither the prelude, the test nor the builtins
  define, plus the names in ``remote`` (the functions under test, even when they shadow a builtin
  as MBPP task 126's ``sum``), are looked up in the program once it is loaded: plain data comes
  back as values, anything else as a `Remote` handle whose calls, attributes, items and iteration
  are requests to the sandbox. A standard-library module name is imported here instead. So a test
  ``assert f(x) == y`` compares, with this interpreter's ``==``, a decoded plain value against
  ``y``, which never reaches the program: the program can pass only by computing ``y``.
- ``stdin`` tests: one fresh sandbox per test, input on fd 0, fd 1 read here (capped) and compared
  with the expected output, LiveCodeBench's way (lines stripped; tokens compared as decimals when
  the text differs). The expected output never reaches the program; the exit status must be 0.
- One deadline for the program's run (SIGALRM, raising `Deadline` wherever the judge is waiting;
  it starts when the first sandbox is ready, whose start-up has its own limit, `START_LIMIT_S`),
  per-process rlimits and cgroup membership applied between fork and exec of the sandbox, and a
  parent-death signal at each step, so nothing outlives a killed caller.
- Outcome per test: "pass", "fail" (an assertion failed or the output differs), "error" (the test
  raised instead), "timeout", "memory", "not_run" (after a stop). The program's status is "error"
  when it could not be loaded, else "pass" when all passed, else the first test's non-pass outcome.
- The result is written on this process's stdout, which no sandboxed process holds or can reach.

What is not covered: see the module docstring of `ibpo_lit.rewards.code`.
"""
import ast
import builtins
import json
import math
import os
import resource
import signal
import sys
import tempfile
import time
from decimal import Decimal, InvalidOperation

if __name__ != "__main__":  # imported (tests); at launch wire.py and box.py are prepended
    from ibpo_lit.rewards.sandbox.box import _LIBC, _PR_SET_PDEATHSIG, Deadline, InfraError, ProgramGone, \
        Sandbox, _kill

PASS, FAIL, ERROR, TIMEOUT, MEMORY, NOT_RUN = "pass", "fail", "error", "timeout", "memory", "not_run"


# ------------------------------------------------------------------ one run
class Run:
    """The state of one `run_tests` call: its spec, the sandbox's rlimits, its cgroups."""

    def __init__(self, spec):
        self.spec = spec
        mb, cpu_s = 1 << 20, math.ceil(spec["timeout_s"]) + 1
        self.limits = [  # (resource, soft, hard)
            (resource.RLIMIT_AS, spec["memory_mb"] * mb, spec["memory_mb"] * mb),
            (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),  # SIGXCPU at the soft limit, SIGKILL at the hard one
            (resource.RLIMIT_FSIZE, spec["file_size_mb"] * mb, spec["file_size_mb"] * mb),
            (resource.RLIMIT_NOFILE, 256, 256),
            (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_STACK, 64 * mb, 64 * mb),
        ]
        if spec["isolation"]["drop_to"] is not None:  # root ignores RLIMIT_NPROC; nobody does not
            nproc = spec["max_processes"] * 4  # per uid: shared by all sandboxes running at once
            self.limits.append((resource.RLIMIT_NPROC, nproc, nproc))
        self.cgroups, self.cgroup_procs = {}, []

    def make_cgroups(self):
        """One group per controller for this run (removed by `remove_cgroups`, even if this fails)."""
        spec, mb = self.spec, 1 << 20
        for ctrl, parent in spec["isolation"]["cgroups"].items():
            path = os.path.join(parent, spec["run_id"])
            os.mkdir(path)
            self.cgroups[ctrl] = path
        if "pids" in self.cgroups:
            _write(self.cgroups["pids"], "pids.max", spec["max_processes"])
        if "memory" in self.cgroups:
            _write(self.cgroups["memory"], "memory.limit_in_bytes", spec["memory_mb"] * mb)
            try:
                _write(self.cgroups["memory"], "memory.memsw.limit_in_bytes", spec["memory_mb"] * mb)
            except OSError:  # no swap accounting
                pass
        self.cgroup_procs = [os.path.join(p, "cgroup.procs") for p in self.cgroups.values()]

    def oom_kills(self):
        if "memory" not in self.cgroups:
            return 0
        with open(os.path.join(self.cgroups["memory"], "memory.oom_control")) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        return 0

    def sweep_cgroups(self, wait_s=2.0):
        """SIGKILL whatever is still in the run's cgroups until they are empty."""
        end = time.monotonic() + wait_s
        for path in self.cgroups.values():
            while time.monotonic() < end:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    pids = [int(p) for p in f.read().split()]
                if not pids:
                    break
                for pid in pids:
                    _kill(pid)
                time.sleep(0.005)

    def remove_cgroups(self):
        self.sweep_cgroups()
        for path in self.cgroups.values():
            for _ in range(100):
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.01)

    def death_cause(self, box, oom_before):
        """Why the program ended on its own: "timeout" (CPU limit), "memory" (OOM kill), "error"."""
        code = box.exit_code(0.5)
        if self.oom_kills() > oom_before:
            return MEMORY
        if code is not None and code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            return TIMEOUT
        return ERROR


def _write(directory, name, value):
    with open(os.path.join(directory, name), "w") as f:
        f.write(str(value))


# ------------------------------------------------------------------ assert tests
def free_names(tree):
    """Names a piece of code reads but never binds."""
    loads, stores = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else stores).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stores.add(node.name)
        elif isinstance(node, ast.arg):
            stores.add(node.arg)
        elif isinstance(node, ast.alias):
            stores.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            stores.add(node.name)
    return loads - stores


def module_names(tree):
    """Names used only as ``name.attribute`` (never called): candidates for a stdlib module."""
    dotted, called = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            dotted.add(node.value.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            called.add(node.func.id)
    return dotted - called


def _outcome(exc):
    """The outcome of a test that raised ``exc``."""
    if isinstance(exc, AssertionError) and getattr(exc, "remote_type", None) is None:
        return FAIL
    if getattr(exc, "remote_type", None) == "MemoryError":
        return MEMORY
    return ERROR


def run_assert(run):
    spec = run.spec
    g = {"__name__": "__judge__", "__builtins__": builtins}
    try:
        exec(compile(spec["prelude"], "<prelude>", "exec"), g)
        trees = [ast.parse(t, f"<test {i}>") for i, t in enumerate(spec["tests"])]
        codes = [compile(tree, f"<test {i}>", "exec") for i, tree in enumerate(trees)]
    except Exception as e:  # noqa: BLE001 - the tests themselves are broken
        raise InfraError(f"bad prelude or tests: {type(e).__name__}: {e}") from None
    wanted, modules = set(spec["remote"]), set()
    for tree in trees:
        wanted |= free_names(tree) - set(g) - set(dir(builtins))
        modules |= module_names(tree)
    # A module the tests use (math.isclose) is the judge's own, not one the program could fake.
    for name in sorted((wanted & modules & set(sys.stdlib_module_names)) - set(spec["remote"])):
        g[name] = __import__(name)
        wanted.discard(name)

    outcomes, detail = [NOT_RUN] * len(codes), ""
    box = Sandbox(run, "serve")
    try:
        _start(box, first=True)
        oom_before = run.oom_kills()
        try:
            box.op("load", spec["program"])
            found = box.op("resolve", sorted(wanted))
            if not isinstance(found, dict):
                raise ProgramGone("resolve reply out of protocol")
            # Only what was asked for: a tampered reply must not replace the prelude's names.
            g.update({name: value for name, value in found.items() if name in wanted})
        except ProgramGone:
            return _result(outcomes, run.death_cause(box, oom_before), "the program exited while loading")
        except Exception as e:  # noqa: BLE001 - raised by the program
            status = MEMORY if getattr(e, "remote_type", None) == "MemoryError" else ERROR
            return _result(outcomes, status, f"load: {e}")
        for i, code in enumerate(codes):
            try:
                exec(code, g)
                outcomes[i] = PASS
            except ProgramGone as e:
                outcomes[i], detail = run.death_cause(box, oom_before), f"test {i}: program gone ({e})"
                break
            except Exception as e:  # noqa: BLE001 - AssertionError, or what the test or program raised
                outcomes[i] = _outcome(e)
                detail = detail or f"test {i}: {type(e).__name__}: {str(e)[:200]}"
                if spec["stop_at_first_failure"]:
                    break
    except Deadline:
        outcomes[outcomes.index(NOT_RUN) if NOT_RUN in outcomes else -1] = TIMEOUT
        detail = "timed out"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        box.close()
    return _result(outcomes, None, detail)


START_LIMIT_S = 5.0  # the first sandbox's start-up: the judge's time, not the program's


def _start(box, first):
    """Start ``box``. The first sandbox starts on its own clock, ``START_LIMIT_S``, and the
    program's ``timeout_s`` begins once it is ready: on a loaded machine an interpreter's
    start-up alone took more than a 1.5 s limit, which made a good program unscorable. Past
    ``START_LIMIT_S`` it is the judge's failure (InfraError). Later sandboxes (one per stdin
    test) start on the program's clock, as the tests before them ran."""
    if not first:
        box.start()  # a Deadline here is the program's timeout
        return
    signal.setitimer(signal.ITIMER_REAL, START_LIMIT_S)
    try:
        box.start()
    except Deadline:
        raise InfraError(f"the sandbox did not start within {START_LIMIT_S:.0f} s") from None
    signal.setitimer(signal.ITIMER_REAL, box.run.spec["timeout_s"])


# ------------------------------------------------------------------ stdin tests
def _lines(text):
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line):
    try:
        return [Decimal(tok) for tok in line.split()]
    except InvalidOperation:
        return None


def outputs_match(got, expected):
    """LiveCodeBench's comparison: stripped lines equal, or equal as lists of decimals."""
    a, b = _lines(got), _lines(expected)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        dx, dy = _decimals(x), _decimals(y)
        if dx is None or dy is None or dx != dy:
            return False
    return True


def run_stdin(run):
    spec = run.spec
    source = "\n".join(src for _, src in spec["program"])
    outcomes, detail = [NOT_RUN] * len(spec["tests"]), ""
    try:
        for i, case in enumerate(spec["tests"]):
            with tempfile.TemporaryFile() as stdin:
                stdin.write(case["input"].encode("utf-8", "surrogatepass"))
                stdin.seek(0)
                box = Sandbox(run, "stdin", stdin=stdin)
                try:
                    outcomes[i] = TIMEOUT  # until decided otherwise
                    _start(box, first=i == 0)
                    oom_before = run.oom_kills()
                    box.send_program(source)
                    out, err, overflow = box.collect_output(spec["max_output_bytes"])
                    code = None if overflow else box.proc.wait()  # an overflowing program is still writing
                    outcomes[i], why = _stdin_outcome(run, oom_before, out, err, overflow, code, case["output"])
                finally:
                    box.close()
            if outcomes[i] != PASS:
                detail = detail or f"test {i}: {why}"
                if spec["stop_at_first_failure"]:
                    break
    except Deadline:
        detail = detail or "timed out"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return _result(outcomes, None, detail)


def _stdin_outcome(run, oom_before, out, err, overflow, code, expected):
    if overflow:
        return FAIL, "output limit exceeded"
    if run.oom_kills() > oom_before or (code != 0 and b"MemoryError" in err):
        return MEMORY, "out of memory"
    if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return TIMEOUT, "CPU time limit"
    if code != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()
        return ERROR, f"exit code {code}: {tail[-1][:200] if tail else ''}"
    if outputs_match(out.decode("utf-8", "replace"), expected):
        return PASS, ""
    return FAIL, "wrong output"


# ------------------------------------------------------------------ entry point
def _result(outcomes, status, detail):
    passed = outcomes.count(PASS)
    if status is None:
        status = PASS if passed == len(outcomes) else next(o for o in outcomes if o != PASS)
        status = FAIL if status == NOT_RUN else status
    return {"passed": passed, "total": len(outcomes), "status": status, "tests": outcomes, "detail": detail}


def _on_alarm(signum, frame):
    raise Deadline()


def main(argv):
    caller = int(argv[1])
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != caller:  # the caller died before the line above took effect
        os._exit(1)
    spec = json.loads(sys.stdin.buffer.read())
    verdict = os.fdopen(os.dup(1), "w")  # the result goes here; what the tests print goes nowhere
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    run = Run(spec)
    try:
        run.make_cgroups()
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, spec["timeout_s"])
        result = (run_stdin if spec["kind"] == "stdin" else run_assert)(run)
    except (InfraError, OSError) as e:
        result = {"infra_error": f"{type(e).__name__}: {e}"}
    except Deadline:
        result = {"infra_error": "the time limit was reached before the program could run"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        run.remove_cgroups()
    verdict.write(json.dumps(result))
    verdict.flush()


if __name__ == "__main__":
    main(sys.argv)
