"""The sandbox as the judge sees it: a process to start, ask, and kill; values that stay in it.

Runs in the judge (source text after wire.py, before judge.py; standard library only).

What is covered:
- `Sandbox.start`: ``bwrap ... -- python -I -S -c <child source> PLAN`` (`bwrap_argv`) in a new
  session, with the rlimits, the cgroup membership and a parent-death signal applied between
  fork and exec (safe: the judge is single-threaded), SIGALRM held off during the spawn, and the
  child's "ready" awaited. A child that dies or says "fatal" before it is ready is an `InfraError`.
- `Sandbox.op`: one request, one reply, matched by sequence number; the reply decoded as data
  (wire.py, bounded in bytes, items and depth) or re-raised here as the program's exception: a
  builtin exception type by name (so ``except ValueError`` in a test works), else `RemoteError`;
  ``remote_type`` names it. EOF, an oversized or malformed reply ends the conversation
  (`ProgramGone`); a reply of the wrong type for ``len``/``str``/``bool``/``in``/iteration is a
  `BadReply`; a reply too big for the judge's memory is the program's MemoryError.
- `Remote`: a handle to a value that stays in the program; calls, attributes, items, ``len``,
  ``str``, ``bool``, ``in`` and iteration are requests. Comparing one fails the test.
- `Sandbox.close`: SIGKILL bwrap's process group (its init is the PID namespace's pid 1, whose
  death kills every process of the program), then empty the run's cgroups.
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
import tempfile

if __name__ != "__main__":  # imported (tests); at launch the source of wire.py is prepended
    from ibpo_lit.rewards.sandbox.wire import (
        WireError,
        decode,
        encode,
        read_frame,
        write_frame,
    )

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
        spec = self.run.spec
        c_r, self.w = os.pipe()
        self.r, c_w = os.pipe()
        plan = {"mode": self.mode, "fds": [c_r, c_w], "max_frame": self.max_frame,
                "workdir": None if spec["isolation"]["bwrap"] else self._workdir()}
        argv = [*spec["isolation"]["launcher"], *bwrap_argv(spec),
                spec["python"], "-I", "-S", "-c", spec["child_src"], json.dumps(plan)]
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

    def _workdir(self):
        """Without namespaces the program needs a private working directory on the host."""
        self.workdir = tempfile.mkdtemp(prefix="ibpo-sandbox-")
        return self.workdir

    def op(self, name, target=None, args=(), kwargs=None):
        """One request; the decoded reply, or the program's exception raised here."""
        self.seq += 1
        try:
            write_frame(self.w, [self.seq, name, target, encode(list(args), _send), encode(kwargs or {}, _send)])
            reply = read_frame(self.r, self.max_frame)
        except (EOFError, OSError, WireError) as e:
            raise ProgramGone(str(e)) from None
        except MemoryError:  # a reply within the frame limit that still did not fit: the program's
            raise _remote_exception("MemoryError", "the reply did not fit in the judge's memory") from None
        if not (isinstance(reply, list) and len(reply) >= 3 and reply[0] == self.seq):
            raise ProgramGone("reply out of protocol")
        if reply[1] == "ok":
            try:
                return decode(reply[2], self._ref, self.run.spec["max_items"])
            except (WireError, RecursionError, TypeError) as e:
                raise ProgramGone(f"undecodable reply: {e}") from None
        if reply[1] == "raise" and len(reply) == 4 and all(isinstance(x, str) for x in reply[2:]):
            raise _remote_exception(reply[2], reply[3][:300])
        raise ProgramGone("reply out of protocol")

    def _ref(self, tag, value, data):
        if tag != "h" or not isinstance(value, int) or isinstance(value, bool):
            raise WireError(f"unexpected {tag!r} reference from the program")
        return Remote(self, {"h": value}, str(data.get("t", "object"))[:80])

    def typed(self, want, name, target, *args):
        """`op` whose reply must be of type ``want`` (``len`` an int, ``str`` a str, ...): a
        program that answers otherwise broke the protocol."""
        value = self.op(name, target, args)
        if type(value) is not want or (want is int and value < 0):
            raise BadReply(f"{name} answered a {type(value).__name__}, not a {want.__name__}")
        return value

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
        """SIGKILL the sandbox: bwrap's process group (bwrap's own init is the PID namespace's
        pid 1, so its death takes every process of the program with it), then the cgroups."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
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


def bwrap_argv(spec):
    """``bwrap ... --`` for one sandbox: every namespace new, nothing of the host writable, and of
    the host's files only what the interpreter needs (its prefix, /usr and the libraries' links);
    the prefix's site-packages hidden (the trainer's dependencies are not the program's). Empty
    without bwrap (`Isolation.none`)."""
    iso = spec["isolation"]
    if not iso["bwrap"]:
        return []
    tmpfs = str(spec["tmpfs_mb"] << 20)
    argv = [iso["bwrap"], "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "sandbox"]
    if spec.get("uid") is not None:
        argv += ["--uid", str(spec["uid"]), "--gid", str(spec["uid"])]
    argv += ["--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    if os.path.isfile("/etc/ld.so.cache"):  # where the dynamic loader finds multiarch libraries
        argv += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for prefix in spec["prefixes"]:
        if not _under(prefix, "/usr"):
            argv += ["--ro-bind", prefix, prefix]
    for hidden in spec["hidden"]:
        argv += ["--tmpfs", hidden]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", tmpfs, "--tmpfs", "/tmp",
             "--size", tmpfs, "--tmpfs", "/dev/shm", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in _ENV.items():
        argv += ["--setenv", key, value]
    return [*argv, "--"]


def _under(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


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


class BadReply(Exception):
    """A reply of the wrong type (``len`` answered with a string): the program's error."""


class HandleCompared(AssertionError):
    """A test compared a value that stayed in the program: the judge cannot decide it, so the test
    fails (an object of the program's may define ``==`` as it likes; only plain data is compared)."""


class Remote:
    """A value that stays in the program: every use is a request to the sandbox.

    Its identity is the judge's own: it is hashable by ``id``, and comparing it with anything
    (``==``, ``!=``) fails the test (`HandleCompared`), never passes it.
    """

    __slots__ = ("_box", "_ref", "_type")

    def __init__(self, box, ref, type_name):
        object.__setattr__(self, "_box", box)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", type_name)

    def _op(self, name, *args, **kwargs):
        return object.__getattribute__(self, "_box").op(name, self._ref, args, kwargs)

    def _typed(self, want, name, *args):
        return object.__getattribute__(self, "_box").typed(want, name, self._ref, *args)

    def __call__(self, *args, **kwargs):
        return self._op("call", *args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):  # protocol probes (copy, pickle, ...)
            raise AttributeError(name)
        return self._op("getattr", name)

    def __setattr__(self, name, value):
        self._op("setattr", name, value)

    def __iter__(self):
        return iter(self._typed(list, "iter"))

    def __len__(self):
        return self._typed(int, "len")

    def __bool__(self):
        return self._typed(bool, "bool")

    def __str__(self):
        return self._typed(str, "str")

    def __contains__(self, item):
        return self._typed(bool, "contains", item)

    def __getitem__(self, key):
        return self._op("getitem", key)

    def __setitem__(self, key, value):
        self._op("setitem", key, value)

    def __eq__(self, other):
        raise HandleCompared(f"compared {self!r}, which stays in the program, with a value")

    def __ne__(self, other):
        raise HandleCompared(f"compared {self!r}, which stays in the program, with a value")

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<{self._type} in the program>"
