"""The sandbox as the judge sees it: a process to start, ask, and kill; values that stay in it.

Runs in the judge (source text after wire.py, before judge.py; standard library only).

What is covered:
- `Sandbox.start`: ``[unshare ...] python -I -S -c <child source> PLAN`` in a new session, with
  the rlimits, the cgroup membership and a parent-death signal applied between fork and exec
  (safe: the judge is single-threaded), SIGALRM held off during the spawn, and the child's
  "ready" awaited. A child that dies or says "fatal" before it is ready is an `InfraError`.
- `Sandbox.op`: one request, one reply, matched by sequence number; the reply decoded as data
  (wire.py) or re-raised here as the program's exception: a builtin exception type by name
  (so ``except ValueError`` in a test works), else `RemoteError`; ``remote_type`` names it. EOF,
  an oversized or malformed reply ends the conversation (`ProgramGone`).
- `Remote`: a handle to a value that stays in the program; calls, attributes, items, ``len``,
  ``str``, ``bool``, ``in`` and iteration are requests. It equals only itself (the judge
  cannot see inside, and does not ask the program).
- `Sandbox.close`: SIGKILL the PID namespace's init (the wrapper then reaps it), then the
  wrapper's process group; empty the run's cgroups; remove the fallback work directory.
"""
import builtins
import ctypes
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile

if __name__ != "__main__":  # imported (tests); at launch the source of wire.py is prepended
    from ibpo_lit.rewards.sandbox.wire import WireError, decode, encode, read_frame, write_frame

_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/tmp",
        "OMP_NUM_THREADS": "1"}
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


class Deadline(BaseException):
    """The run's time is up (raised by the SIGALRM handler wherever the judge is)."""


class ProgramGone(BaseException):
    """The program died, closed its pipe or broke the protocol: no further request is possible."""


class InfraError(Exception):
    """The judge could not do its job (bad tests, sandbox failed to start): the run is unscorable."""


class RemoteError(Exception):
    """An exception raised in the program that is not a builtin exception type."""


# ------------------------------------------------------------------ the sandbox process
def _set_limit(res, soft, hard):
    _, current = resource.getrlimit(res)
    if current != resource.RLIM_INFINITY and os.geteuid() != 0:  # only root may raise a hard limit
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(res, (soft, hard))


def _prepare_child(limits, cgroup_procs):
    """Between fork and exec (the judge is single-threaded, so this is safe)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])  # exec keeps the mask; the spawn blocks SIGALRM
    for path in cgroup_procs:
        with open(path, "w") as f:
            f.write("0")  # cgroup v1: 0 is the writer itself
    for res, soft, hard in limits:
        _set_limit(res, soft, hard)
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Sandbox:
    """One sandboxed interpreter (child.py), reached over two pipes; `close` kills its tree."""

    def __init__(self, run, mode, stdin=None):
        self.run, self.mode, self.stdin = run, mode, stdin
        self.seq, self.max_frame = 0, run.spec["max_frame"]
        self.proc = self.r = self.w = self.workdir = None

    def start(self):
        """Spawn the sandbox and wait for its "ready"; a failure here is the judge's (InfraError)."""
        iso, spec = self.run.spec["isolation"], self.run.spec
        if not iso["mount"]:
            self.workdir = tempfile.mkdtemp(prefix="ibpo-sandbox-")
            if iso["drop_to"] is not None:
                os.chown(self.workdir, iso["drop_to"], iso["drop_to"])
        c_r, self.w = os.pipe()
        self.r, c_w = os.pipe()
        plan = {
            "mode": self.mode, "fds": [c_r, c_w], "mount": iso["mount"], "drop_to": iso["drop_to"],
            "tmpfs_mb": spec["tmpfs_mb"], "prefixes": [sys.base_prefix, sys.base_exec_prefix],
            "workdir": self.workdir, "parent": None if iso["pidns"] else os.getpid(),
            "max_frame": self.max_frame, "run_id": spec["run_id"],
        }
        argv = [*iso["unshare"], spec["python"], "-I", "-S", "-c", spec["child_src"], json.dumps(plan)]
        piped = subprocess.PIPE if self.mode == "stdin" else subprocess.DEVNULL
        limits, procs = self.run.limits, self.run.cgroup_procs
        old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])  # no Deadline mid-spawn
        try:
            self.proc = subprocess.Popen(
                argv, pass_fds=(c_r, c_w), stdin=self.stdin if self.stdin is not None else subprocess.DEVNULL,
                stdout=piped, stderr=piped, env=dict(_ENV), cwd="/", start_new_session=True,
                preexec_fn=lambda: _prepare_child(limits, procs),
            )
        finally:
            os.close(c_r)
            os.close(c_w)
            signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a pending Deadline fires now; close() can kill
        try:
            msg = read_frame(self.r, self.max_frame)
        except (EOFError, WireError, OSError):
            msg = ["fatal", f"exited with code {self.proc.wait()} before it was ready"]
        if msg != ["ready"]:
            raise InfraError(f"sandbox failed to start: {msg[-1]}")

    def op(self, name, target=None, args=(), kwargs=None):
        """One request; the decoded reply, or the program's exception raised here."""
        self.seq += 1
        try:
            write_frame(self.w, [self.seq, name, target, encode(list(args), _send), encode(kwargs or {}, _send)])
            reply = read_frame(self.r, self.max_frame)
        except (EOFError, OSError, WireError) as e:
            raise ProgramGone(str(e)) from None
        if not (isinstance(reply, list) and len(reply) >= 3 and reply[0] == self.seq):
            raise ProgramGone("reply out of protocol")
        if reply[1] == "ok":
            try:
                return decode(reply[2], self._ref)
            except (WireError, RecursionError, TypeError) as e:
                raise ProgramGone(f"undecodable reply: {e}") from None
        if reply[1] == "raise" and len(reply) == 4 and all(isinstance(x, str) for x in reply[2:]):
            raise _remote_exception(reply[2], reply[3][:300])
        raise ProgramGone("reply out of protocol")

    def _ref(self, tag, value, data):
        if tag != "h" or not isinstance(value, int):
            raise WireError(f"unexpected {tag!r} reference from the program")
        return Remote(self, {"h": value}, str(data.get("t", "object"))[:80])

    def send_program(self, source):
        write_frame(self.w, source)
        os.close(self.w)
        os.close(self.r)
        self.w = self.r = None

    def collect_output(self, cap):
        """stdout (up to ``cap`` bytes) and the tail of stderr, until both close; overflow flag."""
        out, err = bytearray(), bytearray()
        streams = {self.proc.stdout.fileno(): out, self.proc.stderr.fileno(): err}
        while streams:
            ready, _, _ = select.select(list(streams), [], [])
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    del streams[fd]
                    continue
                buf = streams[fd]
                buf += chunk
                if buf is out and len(out) > cap:
                    return bytes(out[:cap]), bytes(err[-4096:]), True
                if buf is err and len(err) > 1 << 16:
                    del err[:-4096]
        return bytes(out), bytes(err[-4096:]), False

    def exit_code(self, wait_s):
        """The exit status if the process ends within ``wait_s`` (negative: killed by a signal)."""
        try:
            return self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self):
        if self.proc is not None:
            if self.proc.poll() is None and self.run.spec["isolation"]["pidns"]:
                # Kill the namespace's init first: the kernel kills the rest, and the wrapper reaps
                # it and exits, so no zombie is left for the host's init.
                for pid in _children(self.proc.pid):
                    _kill(pid)
                try:
                    self.proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the wrapper's group (and the program, if no PID namespace)
            except ProcessLookupError:
                pass
            self.proc.wait()
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
        for fd in (self.r, self.w):
            if fd is not None:
                os.close(fd)
        self.r = self.w = None
        self.run.sweep_cgroups()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _send(obj):
    """Encode, for the program, what the tests pass that is not plain data."""
    if isinstance(obj, Remote):
        return object.__getattribute__(obj, "_ref")
    name = getattr(obj, "__name__", None)
    if isinstance(name, str) and getattr(builtins, name, None) is obj:
        return {"bi": name}
    raise WireError(f"cannot send a {type(obj).__name__} to the program")


# Re-raised here, these would steer the tests' control flow (a StopIteration out of a call inside
# map() ends the iteration early, so all(map(...)) would be True): they stay RemoteError.
_CONTROL_FLOW = (StopIteration, StopAsyncIteration)


def _remote_exception(type_name, message):
    cls = getattr(builtins, type_name, None)
    exc = None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, _CONTROL_FLOW):
        try:
            exc = cls(message)
        except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs five arguments
            exc = None
    if exc is None:
        exc = RemoteError(f"{type_name}: {message}")
    exc.remote_type = type_name
    return exc


class Remote:
    """A value that stays in the program: every use is a request to the sandbox."""

    __slots__ = ("_box", "_ref", "_type")

    def __init__(self, box, ref, type_name):
        object.__setattr__(self, "_box", box)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", type_name)

    def _op(self, name, *args, **kwargs):
        return object.__getattribute__(self, "_box").op(name, self._ref, args, kwargs)

    def __call__(self, *args, **kwargs):
        return self._op("call", *args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):  # protocol probes (copy, pickle, ...)
            raise AttributeError(name)
        return self._op("getattr", name)

    def __setattr__(self, name, value):
        self._op("setattr", name, value)

    def __iter__(self):
        return iter(self._op("iter"))

    def __len__(self):
        return self._op("len")

    def __bool__(self):
        return self._op("bool")

    def __str__(self):
        return self._op("str")

    def __contains__(self, item):
        return self._op("contains", item)

    def __getitem__(self, key):
        return self._op("getitem", key)

    def __setitem__(self, key, value):
        self._op("setitem", key, value)

    def __eq__(self, other):  # identity: the judge cannot see inside, and will not ask the program
        return isinstance(other, Remote) and other._ref == self._ref

    def __hash__(self):
        return hash(("remote", self._ref["h"]))

    def __repr__(self):
        return f"<{self._type} in the program>"
