"""The Python interpreter a policy calls mid-solution (tool-integrated rollouts), run in the code
sandbox: the same isolation, limits and statuses as code rewards (docs/sandbox.md).

``PythonTool(histories)`` runs, for each rollout, its newest code cell and returns what the cell
printed (``ToolResult``). The driver that pauses generation at a cell and resumes it after the
output is ``ibpo_lit.rollout.tools.ToolRollouts``; this module knows nothing of models.

What is covered:
    * State within one rollout only, by replay: a rollout's earlier cells run first, silently
      (their exceptions swallowed, and fds 1 and 2 on /dev/null while they run, so nothing they
      write shows, however written: print, sys.__stdout__, os.write(1, ...), a child process),
      then its newest one, all in one fresh sandbox. Variables, imports and functions carry over
      between the turns of one rollout; nothing carries over between rollouts, and every call
      starts from a clean interpreter, so a cell cannot leave anything behind for another
      rollout or for the rewards.
    * Repeatable output: ``random`` is seeded (0) before the first cell, so a replayed cell draws
      what it drew the first time; the sandbox fixes the hash seed and turns address
      randomization off (box.py). The same cells give the same bytes, as resume and the
      one-versus-two-process equality need.
    * Jupyter's display rule: when a cell ends with an expression, its ``repr`` is printed (None
      prints nothing), what tool-integrated math recipes (ToRA, the code-interpreter recipes
      of verl and SGLang) show a model.
    * What the policy reads: stdout, then on an error the traceback's tail (frames of the cells
      only, ``File "<cell 2>", line 1``), cut to ``max_output_chars`` with a marker, and a line
      saying a cell ran past its time or memory. The status (``pass``: ran to the end; ``error``,
      ``timeout``, ``memory``, ``fail``: printed past the sandbox's output cap; ``infra``: the
      harness failed, not the cell) is counted in the run's metrics.

What is not covered:
    * A persistent interpreter: replay re-runs earlier cells, so their time counts again and a
      cell whose effect depends on the clock or the kernel's entropy (os.urandom, secrets, a
      random.Random of its own) may replay differently; a thread an earlier cell left running
      prints into later output. A cell that ends the interpreter (``os._exit``) during replay
      ends the later cells too (they print nothing).
    * Only the standard library (the sandbox hides site-packages): no numpy or sympy.

Why our own and not a library's (e.g. a Jupyter kernel, which TRL's and verl's examples start on
the host): an interpreter on the host runs the policy's code with the trainer's rights. The
sandbox here has been attacked three times (tests/rewards/test_code_attacks*.py); tool calls use
it unchanged.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional, Sequence

from ibpo_lit.rewards.code import CodeTests, SandboxError, detect_isolation, run_code_tests
from ibpo_lit.rewards.sandbox.isolation import Isolation

TOOL_STATUSES = ("pass", "error", "timeout", "memory", "fail", "infra")


@dataclass(frozen=True)
class ToolResult:
    """One cell's run: ``text`` (what the policy reads), ``status`` (one of ``TOOL_STATUSES``)
    and the run's wall-clock ``seconds``."""

    text: str
    status: str
    seconds: float

    @property
    def failed(self) -> bool:
        return self.status != "pass"


def replay_program(cells: Sequence[str]) -> str:
    """The program that runs ``cells[:-1]`` silently, then ``cells[-1]`` with its output (and its
    last expression's ``repr``), its traceback limited to the cells' own frames."""
    if not cells:
        raise ValueError("a tool call needs at least one cell")
    *earlier, last = cells
    return _REPLAY.format(earlier=list(earlier), last=last, n=len(cells))


# Names start with _ibpo_ so a cell's own names never collide with the wrapper's; they are removed
# before the newest cell runs, so it sees only the rollout's own.
_REPLAY = '''\
import ast as _ibpo_ast, os as _ibpo_os, random as _ibpo_random, sys as _ibpo_sys, traceback as _ibpo_tb
_ibpo_sys.stdout.reconfigure(line_buffering=True)  # a cell cut off by its limit keeps what it printed
_ibpo_random.seed(0)  # every call draws the same numbers: a replayed cell draws what it drew the first time
def _ibpo_silently(cells, g, os=_ibpo_os, sys=_ibpo_sys):
    # fds 1 and 2 lead to /dev/null while the earlier cells run, so nothing they write reaches the
    # output however it is written: print, sys.__stdout__, os.write(1, ...), a child process.
    streams = sys.stdout, sys.stderr
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    quiet = open(os.devnull, "w")  # sys.stdout and sys.stderr of the earlier cells
    try:
        for i, source in enumerate(cells):
            sys.stdout = sys.stderr = quiet
            try:
                exec(compile(source, "<cell %d>" % (i + 1), "exec"), g)
            except BaseException:
                pass
            for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__, *streams):
                try:
                    stream.flush()  # what a cell left buffered goes to /dev/null now, not into later output
                except BaseException:
                    pass
            sys.stdout, sys.stderr = streams
    finally:
        quiet.close()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
_ibpo_silently({earlier!r}, globals())
def _ibpo_run(source, name, ast=_ibpo_ast, sys=_ibpo_sys, tb=_ibpo_tb):
    g = globals()
    try:
        tree = ast.parse(source, name)
        shown = tree.body and isinstance(tree.body[-1], ast.Expr)
        last = tree.body.pop() if shown else None
        exec(compile(tree, name, "exec"), g)
        if shown:
            value = eval(compile(ast.Expression(last.value), name, "eval"), g)
            if value is not None:
                print(repr(value))
    except SystemExit:
        raise
    except BaseException as e:
        tb.print_exception(type(e), e, None if isinstance(e, SyntaxError) else e.__traceback__.tb_next)
        sys.stderr.flush()
        sys.exit(1)
for _ibpo_name in [n for n in globals() if n.startswith("_ibpo_") and n != "_ibpo_run"]:
    del globals()[_ibpo_name]
del _ibpo_name
_ibpo_run({last!r}, "<cell {n}>")
'''


class PythonTool:
    """Runs rollouts' code cells in the sandbox, ``workers`` at a time.

    Args:
        timeout_s: Wall-clock limit per call (the replayed cells and the new one together).
        memory_mb: Memory limit of the interpreter (>= 64).
        workers: Cells run at once (each a sandbox of two processes).
        max_output_chars: What the policy reads of a cell's output, at most.
        isolation: Override the detected isolation (tests); None: `detect_isolation`, which raises
            ``SandboxUnavailable`` here, at construction, where the sandbox cannot run.
    """

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 512, workers: int = 4,
                 max_output_chars: int = 1024, isolation: Optional[Isolation] = None) -> None:
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"tools timeout_s must be a finite number > 0, got {timeout_s}")
        if workers < 1 or max_output_chars < 1:
            raise ValueError(f"tools workers and max_output_chars must be >= 1, got {workers}, {max_output_chars}")
        self.spec = CodeTests(kind="run", timeout_s=timeout_s, memory_mb=memory_mb)  # validates memory_mb
        self.max_output_chars = max_output_chars
        self.isolation = isolation if isolation is not None else detect_isolation()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="python-tool")

    def __call__(self, histories: Sequence[Sequence[str]]) -> list[ToolResult]:
        """One result per history (a rollout's cells so far; its last is the one to run)."""
        programs = [replay_program(cells) for cells in histories]
        return list(self._executor.map(self._run, programs))

    def _run(self, program: str) -> ToolResult:
        try:
            result = run_code_tests(program, self.spec, extract=False, isolation=self.isolation)
        except SandboxError as e:
            return ToolResult(f"(the interpreter could not run this cell: {str(e)[:200]})", "infra", 0.0)
        text = result.stdout
        if result.status == "error":
            text += result.stderr
        elif result.status in ("timeout", "memory"):
            limit = (f"TimeoutError: the cell ran past {self.spec.timeout_s:g} s" if result.status == "timeout"
                     else f"MemoryError: the cell used more than {self.spec.memory_mb} MB")
            text += ("" if not text or text.endswith("\n") else "\n") + limit + "\n"
        return ToolResult(self._cut(text), result.status, result.seconds)

    def _cut(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        marker = "\n... (output truncated)\n"
        return text[: max(self.max_output_chars - len(marker), 0)] + marker

    def close(self) -> None:
        self._executor.shutdown(wait=True)
