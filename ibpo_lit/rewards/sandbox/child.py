"""The sandboxed interpreter: confine itself, then run the untrusted program.

Started by the judge as ``[unshare ...] python -I -S -c <wire.py + this file> PLAN_JSON``, with
the rlimits and the cgroup already applied by the judge before exec. Standard library only
(see wire.py for why). The code above ``_serve`` runs before any untrusted code, as root inside
the new namespaces when the plan says so.

What is covered (stage 1, trusted, in this order):
- Mount namespace (``plan["mount"]``): a fresh tmpfs of ``tmpfs_mb`` on /tmp, bound over the
  other world-writable directories (/var/tmp, /dev/shm, /run/lock), so a disk filler fills only
  that tmpfs, and files written there vanish with the namespace. The Python installation is
  bound back read-only at its own path when the uid drop would otherwise lose it (here the
  interpreter lives under /root, which is 0700), or when it lies under a covered directory.
- No new privileges (``PR_SET_NO_NEW_PRIVS``), then the drop to ``drop_to`` (uid and gid 65534,
  no supplementary groups), then the parent-death signal again (a uid change clears it).
- ``exit``/``quit`` builtins (``-S`` skips the site module that defines them); cwd /tmp (or the
  judge's temporary directory when there is no mount namespace).

Then one of two modes:
- ``serve``: a request loop on two inherited pipes. The judge asks it to load the program, to
  resolve global names, and to call, getattr, setattr, iterate, index, len, str values by handle;
  each reply is data (wire.py) or the name and message of the exception raised. Non-plain results
  stay here and go out as handles. The program runs in this process, so it can rewrite this loop
  or answer anything on the pipe: that is expected. What it cannot do is see the expected values,
  which never leave the judge.
- ``stdin``: receive the program over the pipe, close the pipe, and run it as ``__main__`` with
  the test input on fd 0 and fd 1 read by the judge.
"""
import builtins
import json
import os
import sys

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 32, 4096, 16384
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _SIGKILL = 1, 38, 9
_COVERED = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

if __name__ != "__main__":  # imported (tests); at launch the source of wire.py is prepended
    from ibpo_lit.rewards.sandbox.wire import decode, encode, read_frame, write_frame


# ------------------------------------------------------------------ stage 1 (trusted)
def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _check(ctypes, ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _blocked_ancestor(path):
    """The first directory on the way to ``path`` that others cannot traverse, or None."""
    parts = os.path.abspath(path).split("/")[1:]
    for k in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:k])
        if not os.stat(d).st_mode & 0o001:
            return d
    return None


def _under(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def _confine_filesystem(plan, ctypes, libc):
    def mount(src, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else s.encode()  # noqa: E731
        _check(ctypes, libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
               f"mount {target}")

    # What must stay visible: the interpreter's prefix, when the uid drop or the tmpfs would hide it.
    keep = []
    for prefix in dict.fromkeys(plan["prefixes"]):
        blocked = _blocked_ancestor(prefix) if plan["drop_to"] is not None else None
        if blocked or any(_under(prefix, c) for c in _COVERED):
            keep.append((prefix, blocked, os.open(prefix, os.O_PATH | os.O_DIRECTORY)))

    mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={plan['tmpfs_mb']}m,mode=1777")
    for d in _COVERED[1:]:
        if os.path.isdir(d) and not os.path.islink(d):
            mount("/tmp", d, None, _MS_BIND)
    covered = set()
    for prefix, blocked, fd in keep:
        if blocked and blocked not in covered and not any(_under(blocked, c) for c in _COVERED):
            mount("tmpfs", blocked, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
            covered.add(blocked)
        os.makedirs(prefix, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", prefix, None, _MS_BIND | _MS_REC)
        mount(None, prefix, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID)
        os.close(fd)


class _Quitter:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


def confine(plan):
    ctypes, libc = _libc()
    if plan["mount"]:
        _confine_filesystem(plan, ctypes, libc)
    _check(ctypes, libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    if plan["drop_to"] is not None:
        os.setgroups([])
        os.setgid(plan["drop_to"])
        os.setuid(plan["drop_to"])
    # A credential change clears the parent-death signal; without a PID namespace, check that the
    # judge is still there (inside one, getppid() is 0 and the judge kills the namespace instead).
    libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    if plan["parent"] is not None and os.getppid() != plan["parent"]:
        os._exit(70)
    os.chdir(plan["workdir"] or "/tmp")
    os.environ["HOME"] = plan["workdir"] or "/tmp"
    builtins.exit, builtins.quit = _Quitter("exit"), _Quitter("quit")


# ------------------------------------------------------------------ serve mode (untrusted from here)
def _message(e):
    try:
        return str(e)[:300]
    except BaseException:  # noqa: BLE001 - a user exception whose __str__ raises
        return ""


_OPS = {
    "call": lambda f, *a, **k: f(*a, **k),
    "getattr": getattr,
    "setattr": setattr,
    "iter": list,
    "len": len,
    "str": str,
    "bool": bool,
    "contains": lambda obj, x: x in obj,
    "getitem": lambda obj, k: obj[k],
    "setitem": lambda obj, k, v: obj.__setitem__(k, v),
}


def _serve(rfd, wfd, max_frame):
    ns = {"__name__": "__solution__", "__builtins__": builtins}
    handles = {}

    def keep(obj):
        handles[len(handles) + 1] = obj
        return {"h": len(handles), "t": type(obj).__name__[:80]}

    def ref(tag, value, data):
        if tag == "h":
            return handles[value]
        if tag == "n":
            return ns[value]
        return getattr(builtins, value)

    def resolve(names):
        return {name: ns[name] for name in names if name in ns}

    while True:
        try:
            seq, op, target, args, kwargs = read_frame(rfd, max_frame)
        except EOFError:
            os._exit(0)
        reply, stage = [seq, "ok", None], op
        try:
            if op == "load":  # target: [[label, source], ...], run in order in one namespace
                for label, source in target:
                    stage = label
                    exec(compile(source, f"<{label}>", "exec"), ns)
            else:
                if op == "resolve":
                    value = resolve(target)
                else:
                    value = _OPS[op](decode(target, ref), *decode(args, ref), **decode(kwargs, ref))
                reply[2] = encode(value, keep)
        except BaseException as e:  # noqa: BLE001 - SystemExit included: reported, not obeyed
            reply = [seq, "raise", type(e).__name__[:80], f"{stage}: {_message(e)}"]
        write_frame(wfd, reply)


def _run_stdin(rfd, wfd, max_frame):
    write_frame(wfd, ["ready"])
    source = read_frame(rfd, max_frame)
    os.close(rfd)
    os.close(wfd)
    code = compile(source, "<solution>", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": builtins})


def main(argv):
    plan = json.loads(argv[1])
    rfd, wfd = plan["fds"]
    try:
        confine(plan)
    except BaseException as e:  # noqa: BLE001 - a sandbox that cannot confine itself must not run code
        write_frame(wfd, ["fatal", f"{type(e).__name__}: {e}"])
        os._exit(71)
    if plan["mode"] == "stdin":
        _run_stdin(rfd, wfd, plan["max_frame"])
        return
    write_frame(wfd, ["ready"])
    _serve(rfd, wfd, plan["max_frame"])


if __name__ == "__main__":
    main(sys.argv)
