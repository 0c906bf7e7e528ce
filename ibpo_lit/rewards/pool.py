"""Score responses in worker processes, in batches, with a hard timeout.

math-verify can hang on adversarial LaTeX (sympy), and its SIGALRM timeouts only work in the main
thread and cannot interrupt a long C-level call. So scoring runs in persistent worker processes,
and an item that runs past its deadline is ended the only sure way: its worker is killed
(SIGKILL) and a fresh one is started.

What is covered:
- `RewardPool(reward, num_workers, timeout_s, batch_size=None)`: ``pool.score(pairs, prompts,
  columns)`` cuts the responses into batches and sends one batch at a time to each idle worker,
  which calls the reward once per batch in the one calling contract of
  `ibpo_lit.rewards.functions` (``fn(prompts, completions, **columns)``); the parent waits on all
  workers with `multiprocessing.connection.wait`. A built-in reward (a name) gets batches of one
  response, so a slow item holds up only its own worker, for at most ``timeout_s``; an import-path
  reward gets ``batch_size`` responses per call (default: the call's responses split evenly over
  the workers), and its batch's deadline is ``timeout_s`` times its size.
- Unscorable (None), never a silent 0: every response of a batch that timed out, whose function
  raised, returned the wrong number of values or not a list, or whose worker died; a single
  response the function returned None/NaN or a non-number for. ``pool.stats`` counts them
  (``ok``, ``timeout``, ``error``, ``none``) for logging, and ``pool.last_error`` says in a few
  words what the latest failure was (an exception with where it was raised, a timeout, a wrong
  length): what the trainer names when it stops a run whose reward scores nothing
  (``model.max_unscorable_steps``). Each kind of failure is logged once per pool at WARNING,
  one line naming the reward and the cause (no traceback), later ones at DEBUG; every timeout
  is a WARNING (a worker is killed).
- Workers are fresh interpreters (``python -c``, fork + exec like multiprocessing's "spawn", so
  nothing of the trainer's threads or torch state is inherited). Unlike "spawn" they do not
  re-import the parent's ``__main__`` script, so a worker imports only `ibpo_lit.rewards` (and
  math-verify / sympy), plus the modules named in ``import_modules`` (where extra rewards are
  registered). The worker loads the reward with `ibpo_lit.rewards.functions.load_reward` (a name
  in `ibpo_lit.rewards.REWARDS`, or an import path: the user's module is imported in the worker,
  and once in the parent first, so an import error fails at once with its cause).
- Parent death, best effort: an idle worker exits when its pipe reaches EOF; on Linux each worker
  also asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)`` via ctypes),
  which also covers a worker stuck in C code. That signal follows the *thread* that started the
  worker, so workers are started from one thread the pool owns for its lifetime.
- Ctrl-C: workers ignore SIGINT; the parent handles it and closes the pool.

What is not covered:
- Retries: a timed-out or failed item is None, never re-scored; a batch fails as a whole.
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
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Sequence

from ibpo_lit.rewards.builtin import REWARDS, check_gold
from ibpo_lit.rewards.functions import (
    RewardOutputError,
    check_values,
    is_import_path,
    load_reward,
    reward_columns,
    stack_columns,
)

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
    items: list = field(default_factory=list)  # indices of the batch in flight (state "busy")
    deadline: float = 0.0  # monotonic; start-up deadline or the batch's deadline
    pid: int = field(init=False)

    def __post_init__(self) -> None:
        self.pid = self.proc.pid


class RewardPool:
    """Persistent worker processes that score responses in batches with a hard timeout.

    Args:
        reward: A name in `ibpo_lit.rewards.REWARDS` or an import path ``package.module:function``
            (loaded in each worker, and once in the parent to fail early).
        num_workers: Worker processes; batches are scored in parallel across them.
        timeout_s: Hard limit in seconds per response; a batch of ``b`` responses gets
            ``b * timeout_s``, past which its worker is killed and replaced.
        import_modules: Modules each worker (and the parent, to check the name) imports first,
            for rewards registered outside `ibpo_lit.rewards` (e.g. the tests' ``misbehaving_rewards``).
        batch_size: Responses per call of an import-path reward (None: a call's responses split
            evenly over the workers, one call each). Built-in rewards are called per response.

    Raises:
        ValueError: a bad argument, an unknown reward name (listing the valid names), or an
            import path that does not load (`RewardImportError`, naming the cause).
    """

    def __init__(
        self,
        reward: str = "math",
        num_workers: int = 1,
        timeout_s: float = 5.0,
        import_modules: list[str] | None = None,
        batch_size: int | None = None,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or unset, got {batch_size}")
        if reward in REWARDS and getattr(REWARDS[reward], "runs_untrusted_code", False):
            # A worker's timeout around the sandbox would be a second clock, shorter than the
            # program's own limits: a slow wrong program would come back unscorable (None), not 0.
            raise ValueError(f"the {reward} reward is scored by ibpo_lit.rewards.SandboxPool "
                             f"(ibpo_lit.tasks.scoring_pool({reward!r})), whose limits are each program's own; "
                             "a RewardPool timeout would cut it short")
        self.import_modules = list(import_modules or [])
        for name in self.import_modules:
            importlib.import_module(name)
        load_reward(reward)  # fail here, in the parent, on a typo or an import error

        self.reward, self.num_workers, self.timeout_s = reward, num_workers, timeout_s
        self.batch_size = batch_size if is_import_path(reward) else 1
        self._warned: set[str] = set()  # kinds of failure already logged at WARNING
        self.stats: dict[str, int] = {"ok": 0, "timeout": 0, "error": 0, "none": 0}
        self.last_error: str | None = None  # the latest failure's cause, in a few words
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

    def score(self, pairs: Sequence[tuple[str, str]], prompts: Sequence[str] | None = None,
              columns: Sequence[dict] | None = None) -> list[float | None]:
        """Score each (completion, gold) pair; None where it could not be scored (see above).

        ``prompts`` (the problem texts, default "") and ``columns`` (each response's record
        fields, default none) are what an import-path reward receives besides the completions;
        ``gold`` and ``answer`` are added to the columns (`reward_columns`). Results are in the
        order of ``pairs``. Thread-safe (calls are serialized).

        Raises:
            RuntimeError: the pool is closed, is used from a forked child, or a worker failed to
                start (bad ``import_modules``, a broken environment).
            GoldKindError: a gold of a kind the built-in reward is not for (`check_gold`).
        """
        n = len(pairs)
        prompts = [""] * n if prompts is None else list(prompts)
        columns = [{}] * n if columns is None else list(columns)
        if not len(prompts) == len(columns) == n:
            raise ValueError(f"{n} pairs but {len(prompts)} prompts and {len(columns)} column rows")
        for _, gold in pairs:  # a gold of a kind a built-in is not for: a data error, before any work
            check_gold(self.reward, gold)
        items = [(p, c, reward_columns(cols, g)) for (c, g), p, cols in zip(pairs, prompts, columns)]
        with self._lock:
            self._check_usable()
            results: list[float | None] = [None] * n
            size = self.batch_size or max(1, math.ceil(n / self.num_workers))
            todo = deque(list(range(start, min(start + size, n))) for start in range(0, n, size))
            while todo or any(w.state == "busy" for w in self._workers):
                self._dispatch(todo, items)
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

    def _dispatch(self, todo: deque, items: list[tuple[str, str, dict]]) -> None:
        for w in list(self._workers):
            if not todo:
                return
            if w.state != "idle":
                continue
            batch = todo[0]
            prompts = [items[i][0] for i in batch]
            completions = [items[i][1] for i in batch]
            try:
                w.conn.send((batch[0], prompts, completions, stack_columns([items[i][2] for i in batch])))
            except OSError:  # the worker died while idle: replace it, the batch waits
                logger.warning("reward worker %d died while idle; restarting it", w.pid)
                self._replace(w)
                continue
            todo.popleft()
            w.state, w.items = "busy", batch
            w.deadline = time.monotonic() + self.timeout_s * len(batch)

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
                    "reward %r timed out after %.1f s on %d response(s) (items %d..%d; %.1f s per "
                    "response); they are unscorable; killing worker %d",
                    self.reward, self.timeout_s * len(w.items), len(w.items), w.items[0], w.items[-1],
                    self.timeout_s, w.pid,
                )
                self.stats["timeout"] += len(w.items)
                self.last_error = (f"timed out after {self.timeout_s * len(w.items):.1f} s on a batch of "
                                   f"{len(w.items)} response(s) (model.reward_timeout_s: {self.timeout_s:g} s each)")
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
            self._failed("died", f"lost its worker {w.pid}, which died while scoring", w.items,
                         "its worker process died while scoring")
            self._replace(w)
            return
        kind = msg[0]
        if kind == "ready":
            w.state = "idle"
            self._lost_starts = 0
        elif kind == "fatal":  # start-up failed in the worker: a configuration error
            self._fail_start(w, msg[1])
        else:
            first = msg[1]
            assert w.state == "busy" and first == w.items[0], f"worker {w.pid}: reply for {first}, expected {w.items[0]}"
            if kind == "error":  # the call failed as a whole: (kind of failure, message, short cause)
                self._failed(msg[2], msg[3], w.items, msg[4])
            else:
                values, errors = msg[2], msg[3]
                for j, (i, value) in enumerate(zip(w.items, values)):
                    if j in errors:
                        self.stats["error"] += 1
                    elif value is None:
                        self.stats["none"] += 1
                        self.last_error = "returned None or NaN (cannot score)"
                    else:
                        self.stats["ok"] += 1
                        results[i] = value
                if errors:
                    j, why = next(iter(errors.items()))
                    self.last_error = why
                    self._warn_once("bad value", f"{why} (response {w.items[j]}; {len(errors)} such in this batch)")
            w.state, w.items = "idle", []

    def _failed(self, kind: str, why: str, items: list[int], cause: str) -> None:
        """A whole batch is unscorable: counted as errors, logged; ``cause`` becomes ``last_error``."""
        self.stats["error"] += len(items)
        self.last_error = cause
        self._warn_once(kind, f"{why}, on a batch of {len(items)} response(s)")

    def _warn_once(self, kind: str, message: str) -> None:
        """One line per kind of failure at WARNING, the same kind again at DEBUG."""
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        logger.log(level, "reward %r %s: unscorable (NaN), counted in train/reward_errors%s", self.reward, message,
                   "" if level == logging.DEBUG else "; more failures like this one are logged at DEBUG")

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


def _short(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, at most ``limit`` characters (no traceback)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def _raised_at(e: BaseException) -> str:
    """Where ``e`` was raised: `` in fn at file.py:12`` (the innermost frame's line, and the
    function around it rather than a comprehension's own frame), or ""."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return ""
    function = next((f.name for f in reversed(frames) if f.name not in _COMPREHENSIONS), frames[-1].name)
    return f" in {function} at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}"


def _worker_main(conn: Connection, init: dict) -> None:
    """A worker's loop: recv (first, prompts, completions, columns), call the reward once,
    reply ("ok", first, values, {j: error}) or ("error", first, kind, message, cause); exit on EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_parent_death_signal(init["parent_pid"])
    try:
        for name in init["import_modules"]:
            importlib.import_module(name)
        fn = load_reward(init["reward"])
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        reply = ("fatal", f"{type(e).__name__}: {e}")
    else:
        reply = ("ready",)
    try:
        while True:
            conn.send(reply)
            if reply[0] == "fatal":
                return
            first, prompts, completions, columns = conn.recv()
            try:
                values = fn(prompts, completions, **columns)
            except Exception as e:  # noqa: BLE001 - an unscorable batch, not a dead worker
                reply = ("error", first, f"raised {type(e).__name__}", f"raised {type(e).__name__}: {_short(e)}",
                         f"{type(e).__name__}: {_short(e)}{_raised_at(e)}")
                continue
            try:
                reply = ("ok", first, *check_values(values, len(completions)))
            except RewardOutputError as e:
                reply = ("error", first, "bad output", str(e), str(e))
    except (EOFError, OSError):  # the parent closed the pool or died
        return
