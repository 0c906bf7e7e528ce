"""What the OS lets the sandbox use, found once per process and logged when something is missing.

What is covered:
- Namespaces through util-linux ``unshare``: ``--net --pid --fork --kill-child --mount-proc --ipc
  --uts`` (a fresh, empty network namespace; a PID namespace whose init is the program, so when it
  dies the kernel kills every process it left; its own /proc, /tmp, SysV IPC). As non-root,
  ``--map-root-user`` is added (needs unprivileged user namespaces). Failing that, ``--net`` alone.
  Each candidate is probed by running ``true`` under it.
- The uid drop to 65534 (nobody), when running as root: root ignores RLIMIT_NPROC and may write
  anywhere, nobody does not. Without a mount namespace the drop is skipped when the interpreter's
  prefix is not reachable by others (the child could not import the standard library).
- cgroup v1 ``pids`` and ``memory`` (as root, when mounted and writable): a parent group
  ``ibpo_sandbox`` holds one group per run, named ``<caller pid>-<n>-<random>``; groups left by
  dead callers are emptied and removed when detection runs.
- `Isolation.gaps`: what is not contained, logged once as a warning by `detect_isolation`.

What is not covered:
- cgroup v2 (unified hierarchy): not used; processes and memory are then bounded by the PID
  namespace, RLIMIT_NPROC (as nobody) and RLIMIT_AS only.
- The non-root paths (user namespaces) are implemented but not exercised by the tests, which run
  as root here.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

NOBODY = 65534
CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_PARENT = "ibpo_sandbox"
_FULL = ("--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts")


@dataclass(frozen=True)
class Isolation:
    """How a sandbox is entered. ``Isolation()`` is none at all (rlimits and a session only)."""

    unshare: tuple[str, ...] = ()  # argv prefix that enters the namespaces (ends with "--")
    network: bool = False  # a fresh network namespace
    pidns: bool = False  # a PID namespace (and with it, a mount namespace: tmpfs /tmp)
    drop_to: int | None = None  # uid/gid the program runs as
    cgroups: dict[str, str] = field(default_factory=dict)  # controller -> parent directory

    @property
    def mount(self) -> bool:
        return self.pidns  # --mount-proc implies --mount

    @property
    def gaps(self) -> list[str]:
        gaps = []
        if not self.network:
            gaps.append("network is NOT isolated: programs can open connections")
        if not self.pidns and "pids" not in self.cgroups and self.drop_to is None:
            gaps.append("no PID namespace, pids cgroup or non-root uid: a fork bomb is not contained "
                        "and a program's background processes may outlive it")
        if self.drop_to is None and os.geteuid() == 0:
            gaps.append("programs run as root: files outside the temporary directory are not protected")
        if not self.mount:
            gaps.append("no mount namespace: /tmp and /dev/shm are shared with the host")
        if "memory" not in self.cgroups:
            gaps.append("no memory cgroup: memory is bounded per process (RLIMIT_AS) only")
        return gaps

    def as_spec(self) -> dict:
        return {"unshare": list(self.unshare), "network": self.network, "pidns": self.pidns,
                "mount": self.mount, "drop_to": self.drop_to, "cgroups": dict(self.cgroups)}


_detected: Isolation | None = None
_lock = threading.Lock()


def detect_isolation() -> Isolation:
    """The best isolation this process can use (probed on first call, then cached)."""
    global _detected
    with _lock:
        if _detected is None:
            _detected = _detect()
            for gap in _detected.gaps:
                logger.warning("code sandbox: %s", gap)
        return _detected


def _probe(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _detect() -> Isolation:
    root = os.geteuid() == 0
    binary = shutil.which("unshare")
    unshare, network, pidns = (), False, False
    if binary:
        user = () if root else ("--map-root-user",)
        for flags, is_full in (((*user, *_FULL), True), ((*user, "--net"), False)):
            if _probe([binary, *flags, "--", "true"]):
                unshare, network, pidns = (binary, *flags, "--"), True, is_full
                break
    drop_to = None
    if root and (pidns or _reachable_by_others(sys.base_prefix)):
        drop_to = NOBODY
    cgroups = _cgroup_parents() if root else {}
    return Isolation(unshare=unshare, network=network, pidns=pidns, drop_to=drop_to, cgroups=cgroups)


def _reachable_by_others(path: str) -> bool:
    parts = os.path.abspath(path).split("/")[1:]
    return all(os.stat("/" + "/".join(parts[:k])).st_mode & 0o001 for k in range(1, len(parts) + 1))


def _cgroup_parents() -> dict[str, str]:
    parents = {}
    for ctrl in ("pids", "memory"):
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
        parents[ctrl] = parent
    return parents


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
