"""The sandbox as the judge sees it: a process to start, ask, and kill; values that stay in it.

Runs in the judge (source text after wire.py, before judge.py; standard library only).

What is covered:
- `Sandbox.start`: ``bwrap ... -- python -s -S -c <child source> PLAN`` (`bwrap_argv`) in a new
  session, with the rlimits, the cgroup membership, address randomization off and a
  parent-death signal applied between fork and exec (safe: the judge is single-threaded),
  SIGALRM held off during the spawn, and the child's "ready" awaited. A child that dies or says
  "fatal" before it is ready is an `InfraError`.
- Nothing of the host in the sandbox (`bwrap_argv`, `interpreter_view`): no /proc; the
  interpreter at neutral paths (`SANDBOX_PREFIX`) when it lives outside /usr, its sysconfig data
  rewritten to say so, every package directory hidden; the same environment (`_ENV`), uid
  (`SANDBOX_UID`), hostname, pid (2) and working directory on every host and in every run.
- The same output for the same program: a fixed hash seed (``PYTHONHASHSEED``, which ``-I``
  would ignore) and no address randomization, so sets of strings, ``id()`` and default reprs
  repeat from run to run. The clock and the kernel's entropy (``os.urandom``) do not.
- `Sandbox.op`: one request, one reply, matched by sequence number; the reply decoded as data
  (wire.py, bounded in bytes, items and depth) or re-raised here as the program's exception: a
  builtin exception type by name (so ``except ValueError`` in a test works), else `RemoteError`;
  ``remote_type`` names it. EOF, an oversized or malformed reply ends the conversation
  (`ProgramGone`); a reply of the wrong type for ``len``/``str``/``bool``/``in``/iteration is a
  `BadReply`; a reply too big for the judge's memory is the program's MemoryError.
- `Remote`: a handle to a value that stays in the program; calls, attributes, items, ``len``,
  ``str``, ``bool``, ``in`` and iteration are requests. Comparing one fails the test. What a
  test may ask a handle depends on where the judge got it, never on what the program says it is
  (`Remote`'s rights): an entry point, an instance of an entry point the task declares a class,
  and their attributes answer everything; a value returned by any other call answers only
  requests that send nothing of the test's (call, iterate, ``len``, ``bool``, ``str``): asking
  it ``y in v``, ``v.startswith(y)`` or ``v[k]`` would hand ``y`` to the program and believe its
  bool (`HandleQuestioned`, a failed test).
- A seccomp filter (`seccomp_filter`, loaded by bwrap just before the program's interpreter
  starts): the system calls through which a program could reach kernel state shared with other
  runs or the host, or outlive the trainer, fail with EPERM: the keyrings (``keyctl``,
  ``add_key``, ``request_key``: a session keyring the trainer has, as under Docker or systemd,
  is shared), inotify and fanotify (watching host inodes bound into every sandbox), ``flock``
  and ``fcntl``'s locks, leases, notifications and signal owners (a channel between concurrent
  sandboxes on shared inodes), ``ptrace`` and ``process_vm_*`` (tracing the sandbox's init to
  remove its death signal), ``fallocate`` (disk not bounded by the file-size limit),
  ``perf_event_open``, ``bpf``, ``userfaultfd``, ``kcmp``, the file-handle calls and
  ``statmount``/``listmount`` (a mount's source: the host directory bound there); every
  other ABI (i386 and x32 on x86_64) fails whole. x86_64 and aarch64 (elsewhere: no filter,
  and `Isolation` reports it).
- `Sandbox.close`: SIGKILL bwrap's process group (its init is the PID namespace's pid 1, whose
  death kills every process of the program), then empty the run's cgroups.
"""
import builtins
import collections
import ctypes
import errno
import fnmatch
import functools
import json
import os
import platform
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

if __name__ != "__main__":  # imported (tests); at launch the source of wire.py is prepended
    from ibpo_lit.rewards.sandbox.wire import (
        WireError,
        decode,
        encode,
        read_frame,
        write_frame,
    )

# The sandbox's whole environment, the same on every host (bwrap --clearenv, then these): nothing of
# the trainer's. PYTHONHASHSEED fixes the order of sets of strings (a program's output is then a
# function of the program); it is why the interpreter runs with -s -S, not -I, which ignores it
# (the environment is ours alone, so -I's -E had nothing else to keep out). PYTHONSAFEPATH is
# -I's -P: the working directory is not on sys.path.
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/tmp",
        "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONSAFEPATH": "1"}
PYTHON_FLAGS = ("-s", "-S")
# Where an interpreter installed outside /usr (pyenv, conda, uv, a build of one's own) appears in
# the sandbox, so that no path of the host is in sys.executable, sys.prefix, sys.path or a
# module's __file__; a second prefix, if the interpreter has one, at SANDBOX_PREFIX + "-2".
SANDBOX_PREFIX = "/opt/python"
# The program's uid and gid inside its user namespace: the same in every run and on every host
# (the kernel's own uid, outside, is still the run's fresh one as root, the caller's otherwise).
SANDBOX_UID = 1000
_ADDR_NO_RANDOMIZE = 0x0040000  # personality(2): the sandbox's addresses (id(), reprs) repeat run to run
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
    _LIBC.personality(_LIBC.personality(0xFFFFFFFF) | _ADDR_NO_RANDOMIZE)  # kept across exec: bwrap and the program
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Sandbox:
    """One sandboxed interpreter (child.py), reached over two pipes; `close` kills its tree."""

    def __init__(self, run, mode, stdin=None):
        self.run, self.mode, self.stdin = run, mode, stdin
        self.seq, self.max_frame = 0, run.spec["max_frame"]
        self.proc = self.r = self.w = self.workdir = None
        self.partial = (b"", b"")

    def start(self):
        """Spawn the sandbox and wait for its "ready"; a failure here is the judge's (InfraError)."""
        spec = self.run.spec
        c_r, self.w = os.pipe()
        self.r, c_w = os.pipe()
        plan = {"mode": self.mode, "fds": [c_r, c_w], "max_frame": self.max_frame,
                "workdir": None if spec["isolation"]["bwrap"] else self._workdir(),
                "stdin_file": bool(spec["isolation"]["bwrap"]) and self.mode == "stdin"}
        seccomp_fd, files, python = None, [], spec["python"]
        if spec["isolation"]["bwrap"]:  # what bwrap reads at start: the filter, the files it writes in
            rules = seccomp_filter()
            seccomp_fd = None if rules is None else _data_fd(rules)
            view = interpreter_view(spec)
            files, python = [(_data_fd(data), path) for path, data in view.files], view.python
        argv = [*spec["isolation"]["launcher"], *bwrap_argv(spec, seccomp_fd, files), python, *PYTHON_FLAGS, "-c",
                spec["child_src"], json.dumps(plan)]
        passed = [c_r, c_w, *([] if seccomp_fd is None else [seccomp_fd]), *(fd for fd, _ in files)]
        piped = subprocess.PIPE if self.mode == "stdin" else subprocess.DEVNULL
        limits, procs = self.run.limits, self.run.cgroup_procs
        old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])  # no Deadline mid-spawn
        try:
            self.proc = subprocess.Popen(
                argv, pass_fds=passed, stdin=self.stdin if self.stdin is not None else subprocess.DEVNULL,
                stdout=piped, stderr=piped, env=dict(_ENV), cwd="/", start_new_session=True,
                preexec_fn=lambda: _prepare_child(limits, procs),
            )
        finally:
            for fd in passed:
                os.close(fd)
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

    def op(self, name, target=None, args=(), kwargs=None, rights=None):
        """One request; the decoded reply (handles in it get ``rights``: `RESULT` unless said),
        or the program's exception raised here."""
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
            ref = lambda tag, value, data: self._ref(tag, value, data, rights or RESULT)  # noqa: E731
            try:
                return decode(reply[2], ref, self.run.spec["max_items"])
            except (WireError, RecursionError, TypeError) as e:
                raise ProgramGone(f"undecodable reply: {str(e)[:200]}") from None
        if reply[1] == "raise" and len(reply) == 4 and all(isinstance(x, str) for x in reply[2:]):
            raise _remote_exception(reply[2][:80], reply[3][:300])
        raise ProgramGone("reply out of protocol")

    def _ref(self, tag, value, data, rights):
        if tag != "h" or not isinstance(value, int) or isinstance(value, bool):
            raise WireError(f"unexpected {tag[:20]!r} reference from the program")
        return Remote(self, {"h": value}, str(data.get("t", "object"))[:80], rights)

    def typed(self, want, name, target, *args, rights=None):
        """`op` whose reply must be of type ``want`` (``len`` an int, ``str`` a str, ...): a
        program that answers otherwise broke the protocol."""
        value = self.op(name, target, args, None, rights)
        if type(value) is not want or (want is int and value < 0):
            raise BadReply(f"{name} answered a {type(value).__name__}, not a {want.__name__}")
        return value

    def send_program(self, source):
        write_frame(self.w, source)
        os.close(self.w)
        os.close(self.r)
        self.w = self.r = None

    def collect_output(self, cap):
        """stdout (up to ``cap`` bytes) and the tail of stderr, until both close; overflow flag.

        What has arrived so far stays readable in ``partial`` (stdout, stderr) when a `Deadline`
        interrupts the wait: a tool call that prints, then loops, still shows what it printed."""
        out, err = bytearray(), bytearray()
        self.partial = (out, err)
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


def bwrap_argv(spec, seccomp_fd=None, files=()):
    """``bwrap ... --`` for one sandbox: every namespace new, nothing of the host writable, and of
    the host's files only what the interpreter needs (/usr, the libraries' links, the interpreter
    at neutral paths: `interpreter_view`), with every Python package directory hidden (the
    trainer's dependencies are not the program's); the seccomp filter read from ``seccomp_fd``;
    ``files`` (descriptor, path) written into the sandbox read-only. Empty without bwrap
    (`Isolation.none`).

    No ``/proc``: a process reads there the sources of its mounts (the host directories bound in:
    /proc/self/mountinfo names them whatever the mount points are called) and the command line,
    executable and libraries of every process of its namespace, bwrap's own included (its path,
    and all of this argv). /dev/stdin is a copy of the input instead (child.py)."""
    iso = spec["isolation"]
    if not iso["bwrap"]:
        return []
    view = interpreter_view(spec)
    tmpfs = str(spec["tmpfs_mb"] << 20)
    argv = [iso["bwrap"], "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "sandbox", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    if os.path.isfile("/etc/ld.so.cache"):  # where the dynamic loader finds multiarch libraries
        argv += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    argv += view.mounts
    for hidden in view.hidden:
        argv += ["--tmpfs", hidden]
    for fd, path in files:
        argv += ["--ro-bind-data", str(fd), path]
    argv += ["--dev", "/dev", "--size", tmpfs, "--tmpfs", "/tmp", "--size", tmpfs, "--tmpfs", "/dev/shm",
             "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in {**_ENV, **view.env}.items():
        argv += ["--setenv", key, value]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return [*argv, "--"]


_View = collections.namedtuple("_View", "python mounts hidden files env")


def interpreter_view(spec):
    """How the interpreter appears in the sandbox, so that no path of the host does:

    - ``python``: its path there. An interpreter under /usr is where it is (the distribution's
      paths are no one's); one installed elsewhere has its ``lib`` (the standard library, its
      extension modules and their libraries) and its binary bound at `SANDBOX_PREFIX`, where it
      finds its prefix as it would at home (the landmarks beside the binary), so sys.executable,
      sys.prefix, sys.path and every module's __file__ name only `SANDBOX_PREFIX`. A virtual
      environment is never bound in; a ``--copies`` venv's binary gives way to its base's.
    - ``mounts``: those binds (bwrap arguments);
    - ``hidden``: directories covered by an empty tmpfs: every site-packages and dist-packages of
      the interpreter and of /usr (the trainer's packages), and the build configuration
      (``config-*``, ``pkgconfig``: their Makefile and .pc files name the host prefix; nothing
      at run time reads them);
    - ``files``: (path, bytes) written over the sysconfig data (``_sysconfigdata_*.py``, which
      ``sysconfig.get_config_var("prefix")`` reads): the same data with the host prefix replaced;
    - ``env``: ``LD_LIBRARY_PATH`` when the interpreter keeps a shared libpython in its ``lib``
      (pyenv's binary finds it by an absolute host path, which is not in the sandbox).

    Not hidden: the interpreter's compiled files still hold the directory it was built for (the
    binary's, libpython's and extension modules' strings, the .pyc files' source names), as may
    other libraries' files in its ``lib`` (a conda environment's libtool files): a program that
    reads those bytes learns where a pyenv, conda or self-built interpreter lives. Its text files
    (the standard library's sources, the sysconfig data) name only `SANDBOX_PREFIX` (tested).
    docs/sandbox.md says so."""
    return _view(spec["python"], tuple(spec["prefixes"]), tuple(spec["hidden"]))


@functools.lru_cache(maxsize=None)  # the same for every sandbox a judge starts
def _view(python, prefixes, hidden):
    # A virtual environment is never bound in: its lib holds only the trainer's packages, and a
    # venv's copied binary (``venv --copies``) finds its standard library only through the venv's
    # pyvenv.cfg, so the base interpreter it was copied from runs instead (this interpreter's own
    # base: the judge runs the trainer's).
    base = getattr(sys, "_base_executable", "")
    if _is_venv(os.path.dirname(os.path.dirname(python))) and os.path.isfile(base):
        python = os.path.realpath(base)
    outside = [p for p in dict.fromkeys(os.path.normpath(p) for p in prefixes)
               if not (_under(p, "/usr") or _is_venv(p))]
    outside.sort(key=lambda p: not _under(python, p))  # the interpreter's own prefix is SANDBOX_PREFIX
    names = {p: SANDBOX_PREFIX + ("" if i == 0 else f"-{i + 1}") for i, p in enumerate(outside)}
    longest_first = sorted(names, key=len, reverse=True)

    def inside(path):
        for p in longest_first:
            if _under(path, p):
                return names[p] + path[len(p):]
        return path

    mounts, covered, files, env = [], set(hidden), [], {}
    for p in outside:
        for sub in ("lib", "lib64"):
            host = os.path.join(p, sub)
            if os.path.islink(host):
                mounts += ["--symlink", os.readlink(host), inside(host)]
            elif os.path.isdir(host):
                mounts += ["--ro-bind", host, inside(host)]
        covered.update(_matching(p, "lib*", "python3*", "config-*") + _matching(p, "lib*", "pkgconfig"))
        for data_file in _matching(p, "lib*", "python3*", "_sysconfig*"):
            with open(data_file, "rb") as f:
                data = original = f.read()
            for q in longest_first:
                data = data.replace(q.encode(), names[q].encode())
            if data != original:
                files.append((inside(data_file), data))
        if _matching(p, "lib", "libpython3*.so*"):
            env["LD_LIBRARY_PATH"] = inside(os.path.join(p, "lib"))
    if not _under(python, "/usr"):
        mounts += ["--ro-bind", python, inside(python)]
    for root in ("/usr/lib", "/usr/local/lib"):
        covered.update(_matching(root, "python3*", "*-packages"))
    # only what is in the sandbox: a tmpfs elsewhere would make its host path there
    covered = {h for h in covered if os.path.isdir(h) and (_under(h, "/usr") or inside(h) != h)}
    return _View(inside(python), mounts, sorted(inside(h) for h in covered), files, env)


def _is_venv(prefix):
    return os.path.isfile(os.path.join(prefix, "pyvenv.cfg"))


def _matching(root, *parts):
    """Paths under ``root`` whose components match ``parts`` (fnmatch patterns): glob's work
    without importing glob (and contextlib), a few milliseconds of every judge's start."""
    paths = [root]
    for part in parts:
        paths = [os.path.join(p, name) for p in paths if os.path.isdir(p)
                 for name in sorted(os.listdir(p)) if fnmatch.fnmatchcase(name, part)]
    return paths


def _data_fd(data):
    """A descriptor bwrap reads ``data`` from (a memory file, at offset 0: any size, no pipe to fill)."""
    fd = os.memfd_create("bwrap-data", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# ------------------------------------------------------------------ the seccomp filter
# System calls refused with EPERM (see the module docstring): name -> (x86_64, aarch64) number.
DENIED_SYSCALLS = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "inotify_init": (253, None), "inotify_init1": (294, 26), "inotify_add_watch": (254, 27),
    "fanotify_init": (300, 262), "fanotify_mark": (301, 263), "flock": (73, 32), "fallocate": (285, 47),
    "perf_event_open": (298, 241), "bpf": (321, 280), "userfaultfd": (323, 282), "kcmp": (312, 272),
    "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "statmount": (457, 457), "listmount": (458, 458),  # a mount's source: the host directory bound there
}
_FCNTL_NR = (72, 25)
# fcntl commands refused: locks, leases, directory notifications, signal-driven I/O's owner
DENIED_FCNTL = {"F_SETLK": 6, "F_SETLKW": 7, "F_SETOWN": 8, "F_SETSIG": 10, "F_SETOWN_EX": 15,
                "F_OFD_SETLK": 37, "F_OFD_SETLKW": 38, "F_SETLEASE": 1024, "F_NOTIFY": 1026}
_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # column, AUDIT_ARCH_*
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
_X32_BIT = 0x40000000


@functools.lru_cache(maxsize=None)  # the same bytes for every sandbox a judge starts
def seccomp_filter(machine=None):
    """The classic BPF program (``struct sock_filter`` array) bwrap loads with ``--seccomp``; None
    on a machine it has no syscall numbers for. Written out here, not with libseccomp: the judge
    runs with the standard library only, and the program is a few dozen instructions."""
    column, arch = _ARCHES.get(machine or platform.machine(), (None, None))
    if column is None:
        return None
    prog, to_deny = [], []

    def add(code, k, deny=False, jt=0, jf=0):
        if deny:
            to_deny.append(len(prog))
        prog.append([code, jt, jf, k])

    add(_LD_ABS, 4)  # seccomp_data.arch
    add(_JEQ, arch, jt=1)
    add(_RET, _EPERM)  # another ABI (i386, or anything not this machine's): every call refused
    add(_LD_ABS, 0)  # seccomp_data.nr
    if column == 0:
        add(_JGE, _X32_BIT, deny=True)  # the x32 ABI's numbers
    for nr in sorted(n[column] for n in DENIED_SYSCALLS.values() if n[column] is not None):
        add(_JEQ, nr, deny=True)
    add(_JEQ, _FCNTL_NR[column], jt=1)
    add(_RET, _ALLOW)
    add(_LD_ABS, 24)  # seccomp_data.args[1], its low 32 bits: fcntl's command
    for cmd in sorted(DENIED_FCNTL.values()):
        add(_JEQ, cmd, deny=True)
    add(_RET, _ALLOW)
    deny = len(prog)
    add(_RET, _EPERM)
    for i in to_deny:
        prog[i][1] = deny - i - 1
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


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


class HandleQuestioned(AssertionError):
    """A test asked a value the program returned (not plain data, not its declared class's) a
    question that hands the program the test's values: ``y in v``, ``v.startswith(y)``,
    ``v[k]``. The program would answer for itself, so the test fails."""


# A handle's rights: what the judge knows of where it came from (the program's word never counts).
ENTRY, CLASS, OBJECT, RESULT = "entry", "class", "object", "result"


class Remote:
    """A value that stays in the program: every use is a request to the sandbox.

    Its identity is the judge's own: it is hashable by ``id``, and comparing it with anything
    (``==``, ``!=``) fails the test (`HandleCompared`), never passes it.

    Its rights (`ENTRY`: an entry point; `CLASS`: one the task declares a class; `OBJECT`: an
    instance of such a class, or an attribute of an entry point or object; `RESULT`: anything a
    call returned otherwise) decide which requests a test may make. A `RESULT` is what a test
    expected as a value: it may be called, iterated, or asked its ``len``, truth or text (requests
    that send nothing of the test's), and nothing else (`HandleQuestioned`).
    """

    __slots__ = ("_box", "_ref", "_type", "_rights")

    def __init__(self, box, ref, type_name, rights=RESULT):
        object.__setattr__(self, "_box", box)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_rights", rights)

    def _grant(self, rights):
        object.__setattr__(self, "_rights", rights)

    def _op(self, name, rights, *args, **kwargs):
        box = object.__getattribute__(self, "_box")
        return box.op(name, object.__getattribute__(self, "_ref"), args, kwargs, rights)

    def _typed(self, want, name, *args):
        box = object.__getattribute__(self, "_box")
        return box.typed(want, name, self._ref, *args, rights=self._inherited())

    def _inherited(self):
        """The rights of what this handle holds (an object's items are objects; a result's, results)."""
        return RESULT if object.__getattribute__(self, "_rights") == RESULT else OBJECT

    def _asks(self, what):
        if object.__getattribute__(self, "_rights") == RESULT:
            raise HandleQuestioned(f"{what} of {self!r}, a value the program returned: the judge decides only on "
                                   "plain data (return a list, str, dict, ...)")

    def __call__(self, *args, **kwargs):
        return self._op("call", OBJECT if self._rights == CLASS else RESULT, *args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):  # protocol probes (copy, pickle, ...)
            raise AttributeError(name)
        self._asks(f"the attribute {name[:40]!r}")
        return self._op("getattr", OBJECT, name)

    def __setattr__(self, name, value):
        self._asks("setting an attribute")
        self._op("setattr", OBJECT, name, value)

    def __iter__(self):
        return iter(self._typed(list, "iter"))

    def __len__(self):
        return self._typed(int, "len")

    def __bool__(self):
        return self._typed(bool, "bool")

    def __str__(self):
        return self._typed(str, "str")

    def __contains__(self, item):
        self._asks("membership")
        return self._typed(bool, "contains", item)

    def __getitem__(self, key):
        self._asks("an item")
        return self._op("getitem", self._inherited(), key)

    def __setitem__(self, key, value):
        self._asks("setting an item")
        self._op("setitem", OBJECT, key, value)

    def __eq__(self, other):
        raise HandleCompared(f"compared {self!r}, which stays in the program, with a value")

    def __ne__(self, other):
        raise HandleCompared(f"compared {self!r}, which stays in the program, with a value")

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<{self._type} in the program>"
