"""The sandboxed interpreter: confine itself, then run the untrusted program.

Started by the judge as ``bwrap ... -- python -s -S -c <wire.py + this file> PLAN_JSON``, with
the rlimits and the cgroup already applied by the judge before exec, and the namespaces, the
read-only file system view, the uid and the parent-death chain set up by bwrap (`bwrap_argv` in
box.py). Standard library only (see wire.py for why).

What is covered (stage 1, trusted, before any untrusted code):
- No new privileges (``PR_SET_NO_NEW_PRIVS``): no setuid binary can raise the program's rights.
- ``exit``/``quit`` builtins (``-S`` skips the site module that defines them); cwd and HOME /tmp
  (the sandbox's own tmpfs), or the judge's temporary directory when there are no namespaces.
- In bwrap's sandbox, for ``stdin`` programs: /dev/stdin a read-only copy of the input (there is
  no /proc for bwrap's /dev/stdin link to lead to). /dev/stdout, /dev/stderr and /dev/fd lead
  nowhere: a program writes to sys.stdout or fd 1.

Then one of two modes:
- ``serve``: a request loop on two inherited pipes. The judge asks it to load the program, to
  resolve the entry points' names, and to call, getattr, setattr, iterate, index, len, str values
  by handle; each reply is data (wire.py) or the name and message of the exception raised.
  Non-plain results stay here and go out as handles. The program runs in this process, so it can
  rewrite this loop or answer anything on the pipe: that is expected. What it cannot do is see the
  expected values, which never leave the judge.
- ``stdin``: receive the program over the pipe, close the pipe, and run it as ``__main__`` with
  the test input on fd 0 and fd 1 read by the judge.
"""
import builtins
import json
import os
import sys

_PR_SET_NO_NEW_PRIVS = 38

if __name__ != "__main__":  # imported (tests); at launch the source of wire.py is prepended
    from ibpo_lit.rewards.sandbox.wire import decode, encode, read_frame, write_frame


# ------------------------------------------------------------------ stage 1 (trusted)
class _Quitter:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


def confine(plan):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
    os.chdir(plan["workdir"] or "/tmp")
    os.environ["HOME"] = plan["workdir"] or "/tmp"
    builtins.exit, builtins.quit = _Quitter("exit"), _Quitter("quit")
    if plan.get("stdin_file"):
        _stdin_as_file()


def _stdin_as_file():
    """/dev/stdin as a read-only copy of the input on fd 0 (the sandbox has no /proc, so bwrap's
    link to /proc/self/fd/0 leads nowhere): ``open('/dev/stdin')`` reads the input from its start,
    as reopening fd 0 through /proc would. fd 0's own offset does not move."""
    size = os.fstat(0).st_size
    os.unlink("/dev/stdin")
    fd = os.open("/dev/stdin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    try:
        done = 0
        while done < size:
            sent = os.sendfile(fd, 0, done, size - done)
            if sent == 0:
                break
            done += sent
    finally:
        os.close(fd)


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
