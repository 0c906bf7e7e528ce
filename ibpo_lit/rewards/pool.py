"""Score (completion, gold) pairs in worker processes, with a hard per-item timeout.

math-verify can hang on adversarial LaTeX (sympy), and its SIGALRM timeouts only work in the main
thread and cannot interrupt a long C-level call. So scoring runs in persistent worker processes,
and an item that runs past its deadline is ended the only sure way: its worker is killed
(SIGKILL) and a fresh one is started.

What is covered:
- `RewardPool(reward, num_workers, timeout_s)`: ``pool.score(pairs)`` sends one pair at a time to
  each idle worker and waits on all of them with `multiprocessing.connection.wait`; a slow item
  holds up only its own worker, for at most ``timeout_s``. A timed-out item, an item whose reward
  raised (or whose worker died), and an item the reward returned None for all score None.
  ``pool.stats`` counts them (``ok``, ``timeout``, ``error``, ``none``) for logging.
- Workers are fresh interpreters (``python -c``, fork + exec like multiprocessing's "spawn", so
  nothing of the trainer's threads or torch state is inherited). Unlike "spawn" they do not
  re-import the parent's ``__main__`` script, so a worker imports only `ibpo_lit.rewards` (and
  math-verify / sympy), plus the modules named in ``import_modules`` (where extra rewards are
  registered). The worker looks the reward up by name in `ibpo_lit.rewards.REWARDS`.
- Parent death, best effort: an idle worker exits when its pipe reaches EOF; on Linux each worker
  also asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)`` via ctypes),
  which also covers a worker stuck in C code. That signal follows the *thread* that started the
  worker, so workers are started from one thread the pool owns for its lifetime.
- Ctrl-C: workers ignore SIGINT; the parent handles it and closes the pool.

What is not covered:
- Retries: a timed-out or failed item is None, never re-scored.
- Start-up time: a (re)started worker imports math-verify (about 1 s) before it takes work, so
  after a timeout with one worker the next item waits for the new worker; items are not charged
  for that wait (an item's clock starts when it is sent).
- Memory limits per worker (a reward could allocate without bound; only time is bounded).
- Non-POSIX platforms (the pipes are passed as inherited file descriptors).
"""
from __future__ import annotations

import ctypes
import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0  # a worker that is not ready by then is a broken environment
MAX_LOST_STARTS = 3  # workers killed by a signal while starting, in a row, before giving up
_PR_SET_PDEATHSIG = 1

# Run by a worker interpreter: sys.argv[1] is its end of the socket pair.
_BOOTSTRAP = (
    "import sys\n"
    "from multiprocessing.connection import Connection\n"
    "conn = Connection(int(sys.argv[1]))\n"
    "try:\n"
    "    init = conn.recv()\n"
    "except (EOFError, OSError):\n"
    "    sys.exit(0)\n"
    "sys.path[:] = init['sys_path']\n"
    "from ibpo_lit.rewards.pool import _worker_main\n"
    "_worker_main(conn, init)\n"
)


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen
    conn: Connection
    state: str = "starting"  # starting -> idle <-> busy
    item: int = -1  # index of the pair in flight (state "busy")
    deadline: float = 0.0  # monotonic; start-up deadline or the item's deadline
    pid: int = field(init=False)

    def __post_init__(self) -> None:
        self.pid = self.proc.pid


class RewardPool:
    """Persistent worker processes that score (completion, gold) pairs with a hard timeout.

    Args:
        reward: Name of the reward in `ibpo_lit.rewards.REWARDS` (looked up in each worker).
        num_workers: Worker processes; items are scored in parallel across them.
        timeout_s: Hard per-item limit in seconds; past it the worker is killed and replaced.
        import_modules: Modules each worker (and the parent, to check the name) imports first,
            for rewards registered outside `ibpo_lit.rewards` (e.g. the tests' ``misbehaving_rewards``).

    Raises:
        ValueError: a bad argument, or an unknown reward name (listing the valid names).
    """

    def __init__(
        self,
        reward: str = "math",
        num_workers: int = 1,
        timeout_s: float = 5.0,
        import_modules: list[str] | None = None,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        from ibpo_lit.rewards import (
            get_reward,  # here: ibpo_lit.rewards imports this module
        )

        self.import_modules = list(import_modules or [])
        for name in self.import_modules:
            importlib.import_module(name)
        get_reward(reward)  # fail here, in the parent, on a typo

        self.reward, self.num_workers, self.timeout_s = reward, num_workers, timeout_s
        self.stats: dict[str, int] = {"ok": 0, "timeout": 0, "error": 0, "none": 0}
        self.restarts = 0  # workers replaced after a timeout or a death
        self._lost_starts = 0  # workers killed by a signal before "ready", in a row
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        # PR_SET_PDEATHSIG fires when the thread that started a worker exits, so one long-lived
        # thread starts them all, whichever thread calls `score`.
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-pool-starter")
        self._workers: list[_Worker] = []
        try:
            self._workers = [self._start_worker() for _ in range(num_workers)]
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- public
    @property
    def unscorable(self) -> dict[str, int]:
        """Items scored None so far, by cause (``timeout``, ``error``, ``none``)."""
        return {k: self.stats[k] for k in ("timeout", "error", "none")}

    def score(self, pairs: list[tuple[str, str]]) -> list[float | None]:
        """Score each (completion, gold) pair; None where it timed out, raised or was None.

        Results are in the order of ``pairs``. Thread-safe (calls are serialized).

        Raises:
            RuntimeError: the pool is closed, is used from a forked child, or a worker failed to
                start (bad ``import_modules``, a broken environment).
        """
        with self._lock:
            self._check_usable()
            results: list[float | None] = [None] * len(pairs)
            todo = deque(range(len(pairs)))
            while todo or any(w.state == "busy" for w in self._workers):
                self._dispatch(todo, pairs)
                self._wait_and_collect(results)
            return results

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (they change when a worker is replaced)."""
        return [w.pid for w in self._workers]

    def close(self) -> None:
        """Stop the workers (idempotent): idle ones exit on EOF, the rest are killed after 1 s.

        Not meant to run while another thread is inside `score`.
        """
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._owner_pid:  # a forked copy: the workers belong to the parent
            return
        for w in self._workers:
            w.conn.close()
        deadline = time.monotonic() + 1.0
        for w in self._workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        self._workers = []
        self._starter.shutdown(wait=False)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -------------------------------------------------------------- internals
    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("RewardPool is closed")
        if os.getpid() != self._owner_pid:
            raise RuntimeError("RewardPool was created in another process (fork); create one here")

    def _start_worker(self) -> _Worker:
        return self._starter.submit(self._popen).result()

    def _popen(self) -> _Worker:
        parent_sock, child_sock = socket.socketpair()
        with child_sock:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        conn = Connection(parent_sock.detach())
        init = {
            "sys_path": list(sys.path),
            "import_modules": self.import_modules,
            "reward": self.reward,
            "parent_pid": os.getpid(),
        }
        try:
            conn.send(init)
        except OSError:  # died at once; reported when its "ready" never comes
            pass
        return _Worker(proc, conn, deadline=time.monotonic() + STARTUP_TIMEOUT_S)

    def _replace(self, w: _Worker) -> None:
        """Kill ``w`` (if alive) and put a fresh worker in its slot."""
        w.conn.close()
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait()
        self.restarts += 1
        self._workers[self._workers.index(w)] = self._start_worker()

    def _dispatch(self, todo: deque, pairs: list[tuple[str, str]]) -> None:
        for w in list(self._workers):
            if not todo:
                return
            if w.state != "idle":
                continue
            i = todo[0]
            try:
                w.conn.send((i, pairs[i][0], pairs[i][1]))
            except OSError:  # the worker died while idle: replace it, the item waits
                logger.warning("reward worker %d died while idle; restarting it", w.pid)
                self._replace(w)
                continue
            todo.popleft()
            w.state, w.item, w.deadline = "busy", i, time.monotonic() + self.timeout_s

    def _wait_and_collect(self, results: list[float | None]) -> None:
        waiting = [w for w in self._workers if w.state in ("busy", "starting")]
        if not waiting:
            return
        timeout = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
        ready = set(wait([w.conn for w in waiting], timeout=timeout))
        now = time.monotonic()
        for w in waiting:
            if w.conn in ready:
                self._receive(w, results)
            elif now >= w.deadline:
                if w.state == "starting":
                    self._fail_start(w, f"not ready after {STARTUP_TIMEOUT_S:.0f} s")
                logger.warning(
                    "reward %r timed out after %.1f s on item %d; killing worker %d",
                    self.reward, self.timeout_s, w.item, w.pid,
                )
                self.stats["timeout"] += 1
                results[w.item] = None
                self._replace(w)

    def _receive(self, w: _Worker, results: list[float | None]) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            if w.state == "starting":
                code = w.proc.wait()
                self._lost_starts += 1
                if code >= 0 or self._lost_starts > MAX_LOST_STARTS:  # its own error, or again and again
                    self._fail_start(w, f"exited with code {code} before it was ready")
                logger.warning("reward worker %d was killed (signal %d) while starting; restarting it", w.pid, -code)
                self._replace(w)
                return
            logger.warning("reward worker %d died on item %d; restarting it", w.pid, w.item)
            self.stats["error"] += 1
            results[w.item] = None
            self._replace(w)
            return
        kind = msg[0]
        if kind == "ready":
            w.state = "idle"
            self._lost_starts = 0
        elif kind == "fatal":  # start-up failed in the worker: a configuration error
            self._fail_start(w, msg[1])
        else:
            _, i, value = msg
            assert w.state == "busy" and i == w.item, f"worker {w.pid}: reply for {i}, expected {w.item}"
            if kind == "error":
                logger.debug("reward %r raised on item %d: %s", self.reward, i, value)
                self.stats["error"] += 1
            elif value is None:
                self.stats["none"] += 1
            else:
                self.stats["ok"] += 1
                results[i] = value
            w.state = "idle"

    def _fail_start(self, w: _Worker, why: str) -> None:
        w.conn.close()
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait()
        self._workers.remove(w)
        self.close()
        raise RuntimeError(f"reward worker for {self.reward!r} failed to start: {why}")


# ------------------------------------------------------------------ worker side
def _set_parent_death_signal(parent_pid: int) -> None:
    """Best effort, Linux only: have the kernel SIGKILL this process when its parent dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def _worker_main(conn: Connection, init: dict) -> None:
    """A worker's loop: recv (i, completion, gold), reply ("ok"|"error", i, value); exit on EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_parent_death_signal(init["parent_pid"])
    try:
        for name in init["import_modules"]:
            importlib.import_module(name)
        from ibpo_lit.rewards import get_reward

        fn = get_reward(init["reward"])
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        reply = ("fatal", f"{type(e).__name__}: {e}")
    else:
        reply = ("ready",)
    try:
        while True:
            conn.send(reply)
            if reply[0] == "fatal":
                return
            i, completion, gold = conn.recv()
            try:
                value = fn(completion, gold)
                reply = ("ok", i, None if value is None else float(value))
            except Exception as e:  # noqa: BLE001 - an unscorable item, not a dead worker
                reply = ("error", i, f"{type(e).__name__}: {e}")
    except (EOFError, OSError):  # the parent closed the pool or died
        return
