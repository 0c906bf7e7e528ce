"""The judge: a trusted interpreter that runs the tests and decides each one.

Started by `ibpo_lit.rewards.code.run_tests` as ``python -I -S -c <wire.py + box.py + this file>
CALLER_PID`` with a JSON spec on stdin; writes one JSON result on stdout. Standard library only
(see wire.py). It never runs the program's code: it starts the sandbox (box.py, child.py) and
talks to it.

What is covered:
- Set-up as root (when the caller is root): the run's cgroups (the program's and the judge's own,
  with their memory and pids limits), then the judge joins its own, keeps the interpreter and
  bwrap reachable in a mount namespace of its own, and drops to the run's uid (`Run.enter`),
  before it reads a byte of the program's.
- ``assert`` tests: the prelude (trusted: imports, helpers such as HumanEval's ``poly``), the
  ``setup`` and every test run *here*. Only the entry points (``remote``) are looked up in the
  program once it is loaded; plain data comes back as values, anything else as a `Remote`
  handle whose calls, attributes, items and iteration are requests to the sandbox. Every other
  name is the judge's (`judge_names`): a standard-library module name is imported here, and a
  name nothing defines is an `InfraError` before the program runs. So a test ``assert f(x) == y``
  compares, with this interpreter's ``==``, a decoded plain value against ``y``, which never
  reaches the program: the program can pass only by computing ``y``. Any exception while a test
  handles the program's values is that test's outcome; its message is logged only when it is
  plain text (`_describe`), so formatting it runs nothing of the program's.
- ``stdin`` tests: one fresh sandbox per test, input on fd 0, fd 1 read here (capped) and compared
  with the expected output, LiveCodeBench's way (lines stripped; tokens compared as decimals when
  the text differs; output that cannot be compared is a mismatch). The expected output never
  reaches the program; the exit status must be 0.
- One deadline for the program's run (SIGALRM, raising `Deadline` wherever the judge is waiting;
  it starts when the first sandbox is ready, whose start-up has its own limit, `START_LIMIT_S`),
  per-process rlimits and cgroup membership applied between fork and exec of the sandbox, and a
  parent-death signal at each step, so nothing outlives a killed caller.
- "running" on stdout once the program's data flows (`Run.announce_running`): the caller's
  watchdog scores a judge that dies or hangs after it as the program's failure.
- Outcome per test: "pass", "fail" (an assertion failed, a handle was compared, or the output
  differs), "error" (the test raised instead), "timeout", "memory", "not_run" (after a stop). The
  program's status is "error" when it could not be loaded, else "pass" when all passed, else the
  first test's non-pass outcome.
- The result is the last line on this process's stdout, which no sandboxed process holds.

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
import time
from decimal import Decimal, InvalidOperation

if __name__ != "__main__":  # imported (tests); at launch wire.py and box.py are prepended
    from ibpo_lit.rewards.sandbox.box import _LIBC, _PR_SET_PDEATHSIG, CLASS, ENTRY, Deadline, InfraError, ProgramGone, \
        Sandbox, _kill

PASS, FAIL, ERROR, TIMEOUT, MEMORY, NOT_RUN = "pass", "fail", "error", "timeout", "memory", "not_run"


# ------------------------------------------------------------------ one run
class Run:
    """The state of one `run_tests` call: its spec, the sandbox's rlimits, its cgroups."""

    def __init__(self, spec, verdict=None):
        self.spec, self.verdict, self.running = spec, verdict, False
        mb, cpu_s = 1 << 20, math.ceil(spec["timeout_s"]) + 1
        self.limits = [  # (resource, soft, hard)
            (resource.RLIMIT_AS, spec["memory_mb"] * mb, spec["memory_mb"] * mb),
            (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),  # SIGXCPU at the soft limit, SIGKILL at the hard one
            (resource.RLIMIT_FSIZE, spec["file_size_mb"] * mb, spec["file_size_mb"] * mb),
            (resource.RLIMIT_NOFILE, 256, 256),
            (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_STACK, 64 * mb, 64 * mb),
        ]
        if spec["uid"] is not None:  # the run's own uid: its process count is the program's alone
            nproc = spec["max_processes"] + 4  # + the judge and bwrap's two processes
            self.limits.append((resource.RLIMIT_NPROC, nproc, nproc))
        self.cgroups, self.judge_cgroups, self.cgroup_procs = {}, {}, []

    def make_cgroups(self):
        """The program's group and the judge's, per controller (the caller removes them)."""
        spec, mb = self.spec, 1 << 20
        for ctrl, parent in spec["isolation"]["cgroups"].items():
            for groups, name in ((self.cgroups, spec["run_id"]), (self.judge_cgroups, spec["run_id"] + "-judge")):
                path = os.path.join(parent, name)
                os.mkdir(path)
                groups[ctrl] = path
        for groups, pids, memory in ((self.cgroups, spec["max_processes"], spec["memory_mb"] * mb),
                                     (self.judge_cgroups, 8, spec["judge_memory_mb"] * mb)):
            if "pids" in groups:
                _write(groups["pids"], "pids.max", pids)
            if "memory" in groups:
                _write(groups["memory"], "memory.limit_in_bytes", memory)
                try:
                    _write(groups["memory"], "memory.memsw.limit_in_bytes", memory)
                except OSError:  # no swap accounting
                    pass
        self.cgroup_procs = [os.path.join(p, "cgroup.procs") for p in self.cgroups.values()]

    def enter(self):
        """Leave root: join the judge's cgroups, keep the interpreter reachable, become the run's uid.

        From here on the judge reads the program's replies as an ordinary user whose memory and
        processes are bounded, so a reply that breaks the decoder breaks only this run.
        """
        spec = self.spec
        for path in self.judge_cgroups.values():
            _write(path, "cgroup.procs", os.getpid())
        judge_bytes = spec["judge_memory_mb"] << 20  # the bound where no memory cgroup holds the judge
        resource.setrlimit(resource.RLIMIT_AS, (judge_bytes + (512 << 20), resource.RLIM_INFINITY))
        uid = spec["uid"]
        if uid is None:
            return
        for path in self.cgroup_procs:  # the sandbox joins its group itself, as this uid (v1 rule)
            os.chown(path, uid, uid)
        _keep_reachable(spec["reachable"])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # a uid change clears it
        if os.getppid() != spec["caller"]:
            os._exit(1)

    def announce_running(self):
        """Tell the caller that the program's data now flows: from here on, a judge that dies or
        hangs does so on the program's values, and the caller scores it as the program's failure."""
        if not self.running and self.verdict is not None:
            self.verdict.write("running\n")
            self.verdict.flush()
        self.running = True

    def oom_kills(self):
        if "memory" not in self.cgroups:
            return 0
        with open(os.path.join(self.cgroups["memory"], "memory.oom_control")) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        return 0

    def sweep_cgroups(self, wait_s=2.0):
        """SIGKILL whatever is still in the program's cgroups until they are empty."""
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

    def death_cause(self, box, oom_before):
        """Why the program ended on its own: "timeout" (CPU limit), "memory" (OOM kill), "error"."""
        code = box.exit_code(0.5)
        if self.oom_kills() > oom_before:
            return MEMORY
        if code is not None and code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            return TIMEOUT
        return ERROR


_CLONE_NEWNS, _MS_RDONLY, _MS_NOSUID, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = \
    0x20000, 1, 2, 32, 4096, 16384, 1 << 18


def _keep_reachable(paths):
    """In a mount namespace of the judge's own, make ``paths`` (the interpreter's prefix, bwrap)
    reachable by the run's uid: a directory on the way that others cannot enter (pyenv under
    /root, 0700) is covered by an empty tmpfs, and the path bound back read-only on it. bwrap
    resolves its bind sources by name, as the run's uid, so an inherited descriptor would not do."""
    import ctypes

    def check(ret, what):
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(src, target, fstype, flags, data=None):
        enc = lambda x: None if x is None else x.encode()  # noqa: E731
        check(_LIBC.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")

    blocked = {}
    for path in paths:
        parts = os.path.abspath(path).split("/")[1:]
        for k in range(1, len(parts) + 1):
            d = "/" + "/".join(parts[:k])
            if not os.stat(d).st_mode & 0o001:
                blocked.setdefault(d, []).append(path)
                break
    if not blocked:
        return
    check(_LIBC.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host
    kept = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for ps in blocked.values() for p in ps]
    for d in blocked:
        mount("tmpfs", d, "tmpfs", _MS_NOSUID, "size=1m,mode=0755")
    for path, fd in kept:
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        mount(None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID)
        os.close(fd)


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


def _describe(exc):
    """``exc`` for the log, without running anything of the program's: its message only when every
    argument is a plain string (an assert message may hold a handle, or an int too long to print)."""
    name = type(exc).__name__
    args = getattr(exc, "args", ())
    if args and all(type(a) is str for a in args):
        return f"{name}: {' '.join(args)[:200]}"
    return name


def judge_names(spec, trees, g):
    """Bind, in the judge's namespace ``g``, every name the tests and setup read that is not an
    entry point: the prelude's, the builtins, and standard-library modules used as ``mod.attr``.

    Raises:
        InfraError: a name that nothing defines (the tests are broken, not the program).
    """
    remote, stores, free, dotted = set(spec["remote"]), set(), set(), set()
    for tree in trees:
        free |= free_names(tree)
        stores |= bound_names(tree)
        dotted |= module_names(tree)
    unbound = free - stores - remote - set(g) - set(dir(builtins))
    for name in sorted(unbound & dotted & set(sys.stdlib_module_names)):
        g[name] = __import__(name)
        unbound.discard(name)
    if unbound:
        raise InfraError(f"the tests use names that neither the prelude, the setup nor the tests define, "
                         f"and that are not entry points (remote): {sorted(unbound)}")


def bound_names(tree):
    """Names a piece of code binds anywhere (a test may use what an earlier one bound)."""
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)} | {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))} | {
        (a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names}


def run_assert(run):
    """Run the tests here; only the entry points (``remote``) come from the program.

    Every other name is the judge's (`judge_names`), ``setup`` runs here after the entry points are
    bound, and any exception while a test handles the program's values is that test's outcome.
    """
    spec = run.spec
    g = {"__name__": "__judge__", "__builtins__": builtins}
    try:
        exec(compile(spec["prelude"], "<prelude>", "exec"), g)
        trees = [ast.parse(t, f"<test {i}>") for i, t in enumerate(spec["tests"])]
        setup_tree = ast.parse(spec["setup"], "<setup>")
        codes = [compile(tree, f"<test {i}>", "exec") for i, tree in enumerate(trees)]
        setup = compile(setup_tree, "<setup>", "exec")
    except Exception as e:  # noqa: BLE001 - the tests themselves are broken
        raise InfraError(f"bad prelude, setup or tests: {type(e).__name__}: {e}") from None
    judge_names(spec, [*trees, setup_tree], g)
    wanted = sorted(spec["remote"])

    outcomes, detail = [NOT_RUN] * len(codes), ""
    box = Sandbox(run, "serve")
    try:
        _start(box, first=True)
        oom_before = run.oom_kills()
        try:
            box.op("load", spec["program"])
            found = box.op("resolve", wanted, rights=ENTRY)
            if not isinstance(found, dict):
                raise ProgramGone("resolve reply out of protocol")
            missing = [name for name in wanted if name not in found]
            if missing:  # the prelude's stub (HumanEval's) must not stand in for the program's
                return _result(outcomes, ERROR, f"load: the program does not define {', '.join(missing)}")
            # Only the entry points: a tampered reply must not replace any other name.
            g.update({name: value for name, value in found.items() if name in wanted})
            for name in spec.get("classes", ()):
                if isinstance(g[name], Remote):
                    g[name]._grant(CLASS)  # its instances may be asked (the task says it is a class)
            exec(setup, g)
        except ProgramGone:
            return _result(outcomes, run.death_cause(box, oom_before), "the program exited while loading")
        except Deadline:
            raise
        except BaseException as e:  # noqa: BLE001 - raised by the program, or by setup on its values
            status = MEMORY if getattr(e, "remote_type", None) == "MemoryError" else ERROR
            return _result(outcomes, status, f"load: {_describe(e)}")
        for i, code in enumerate(codes):
            try:
                exec(code, g)
                outcomes[i] = PASS
            except ProgramGone as e:
                outcomes[i], detail = run.death_cause(box, oom_before), f"test {i}: program gone ({e})"
                break
            except Deadline:
                raise
            except BaseException as e:  # noqa: BLE001 - whatever the test raised on the program's values
                outcomes[i] = _outcome(e)
                detail = detail or f"test {i}: {_describe(e)}"
                if spec["stop_at_first_failure"]:
                    break
    except Deadline:
        outcomes[outcomes.index(NOT_RUN) if NOT_RUN in outcomes else -1] = TIMEOUT
        detail = "timed out"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        box.close()
    return _result(outcomes, None, detail)


START_LIMIT_S = 10.0  # the first sandbox's start-up: the judge's time, not the program's
# (5 s was seen to expire at load ~13 on 2 cores: good programs came back unscorable. A start that
# fails outright exits at once; this limit only ends one that hangs.)


def _start(box, first):
    """Start ``box`` on a clock of its own, ``START_LIMIT_S``: set-up is never the program's time
    (on a loaded machine an interpreter's start-up alone took more than a 1.5 s limit, which made
    a good program fail or go unscorable). The program's ``timeout_s`` begins when the first
    sandbox is ready and pauses while each later one (one per stdin test) starts. Past
    ``START_LIMIT_S`` it is the judge's failure (InfraError)."""
    left = box.run.spec["timeout_s"] if first else signal.getitimer(signal.ITIMER_REAL)[0]
    signal.setitimer(signal.ITIMER_REAL, START_LIMIT_S)
    try:
        box.start()
    except Deadline:
        raise InfraError(f"the sandbox did not start within {START_LIMIT_S:.0f} s") from None
    if not first and left <= 0:  # (the program's time ran out exactly between two tests)
        raise Deadline()
    signal.setitimer(signal.ITIMER_REAL, left)
    if first:
        box.run.announce_running()


# ------------------------------------------------------------------ stdin tests
def _lines(text):
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line):
    try:
        return [Decimal(tok) for tok in line.split()]
    except InvalidOperation:
        return None


def outputs_match(got, expected):
    """LiveCodeBench's comparison: stripped lines equal, or equal as lists of decimals.

    Output that cannot be compared (``sNaN``, which makes Decimal comparison raise) is a mismatch.
    """
    try:
        return _outputs_match(got, expected)
    except Exception:  # noqa: BLE001 - decimal signals on the program's tokens: not equal
        return False


def _outputs_match(got, expected):
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
            stdin = _sealed_input(case["input"].encode("utf-8", "surrogatepass"))
            try:
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
            finally:
                os.close(stdin)
            if outcomes[i] != PASS:
                detail = detail or f"test {i}: {why}"
                if spec["stop_at_first_failure"]:
                    break
    except Deadline:
        detail = detail or "timed out"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return _result(outcomes, None, detail)


# ------------------------------------------------------------------ one run, output returned
RUN_STDOUT_BYTES = 6 << 10  # what a "run" verdict carries: JSON may escape a byte into 6, and the
RUN_STDERR_BYTES = 1 << 10  # caller reads at most 64 KiB of verdict (MAX_VERDICT_BYTES)


def run_once(run):
    """``run`` (a tool call, not a test): the program once, with empty stdin; its stdout (the first
    ``RUN_STDOUT_BYTES``) and stderr's tail come back in the verdict, for the policy to read. No
    output is judged: status "pass" is exit code 0, "error" any other exit (a traceback, on
    stderr), "fail" output past ``max_output_bytes``, "timeout", "memory"."""
    spec = run.spec
    source = "\n".join(src for _, src in spec["program"])
    stdin = _sealed_input(b"")
    status, why, out, err = TIMEOUT, "timed out", b"", b""
    box = None
    try:
        box = Sandbox(run, "stdin", stdin=stdin)
        _start(box, first=True)
        oom_before = run.oom_kills()
        box.send_program(source)
        out, err, overflow = box.collect_output(spec["max_output_bytes"])
        code = None if overflow else box.proc.wait()
        status, why = _exit_outcome(run, oom_before, err, overflow, code)
    except Deadline:
        out, err = (bytes(b) for b in box.partial)  # what it printed before the limit
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if box is not None:
            box.close()
        os.close(stdin)
    result = _result([status], status, why)
    result["stdout"] = out[:RUN_STDOUT_BYTES].decode("utf-8", "replace")
    result["stderr"] = err[-RUN_STDERR_BYTES:].decode("utf-8", "replace")
    return result


def _exit_outcome(run, oom_before, err, overflow, code):
    """How a program that ran to its end (or was cut off) ended, whatever it printed."""
    if overflow:
        return FAIL, "output limit exceeded"
    if run.oom_kills() > oom_before or (code != 0 and b"MemoryError" in err):
        return MEMORY, "out of memory"
    if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return TIMEOUT, "CPU time limit"
    if code != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()
        return ERROR, f"exit code {code}: {tail[-1][:200] if tail else ''}"
    return PASS, ""


def _sealed_input(data):
    """A read-only descriptor of ``data`` in a sealed memory file: the program's fd 0 is no file of
    the host's (a host temporary file was writable and took ``fallocate`` up to the free space),
    and nothing can write, grow or shrink it."""
    import fcntl

    fd = os.memfd_create("stdin", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(fd)


def _stdin_outcome(run, oom_before, out, err, overflow, code, expected):
    status, why = _exit_outcome(run, oom_before, err, overflow, code)
    if status != PASS:
        return status, why
    if outputs_match(out.decode("utf-8", "replace"), expected):
        return PASS, ""
    return FAIL, "wrong output"


# ------------------------------------------------------------------ entry point
MAX_DETAIL = 500  # characters of the verdict's detail: it may quote the program's text


def _result(outcomes, status, detail):
    passed = outcomes.count(PASS)
    detail = detail if len(detail) <= MAX_DETAIL else detail[:MAX_DETAIL - 3] + "..."
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
    spec["caller"] = caller
    verdict = os.fdopen(os.dup(1), "w")  # the result goes here; what the tests print goes nowhere
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    run = Run(spec, verdict)
    try:
        run.make_cgroups()
        run.enter()
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, spec["timeout_s"])
        result = {"stdin": run_stdin, "run": run_once}.get(spec["kind"], run_assert)(run)
    except OSError as e:
        if run.running:  # the program's data flows: a judge that breaks now breaks on the program's doing
            tests = [ERROR] + [NOT_RUN] * (len(spec["tests"]) - 1)
            result = _result(tests, ERROR, f"the judge failed on the program's data: {type(e).__name__}: {e}")
        else:
            result = {"infra_error": f"{type(e).__name__}: {str(e)[:MAX_DETAIL]}"}
    except InfraError as e:
        result = {"infra_error": f"{type(e).__name__}: {str(e)[:MAX_DETAIL]}"}
    except Deadline:
        result = {"infra_error": "the time limit was reached before the program could run"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        run.sweep_cgroups()  # the caller removes the groups: this uid may not
    verdict.write(json.dumps(result) + "\n")
    verdict.flush()


if __name__ == "__main__":
    main(sys.argv)
