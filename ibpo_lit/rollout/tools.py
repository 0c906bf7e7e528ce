"""Tool-integrated rollouts: the policy writes a code cell mid-solution, generation pauses, the
cell runs, its output is appended as a tool turn, and generation resumes.

``ToolRollouts`` wraps any ``RolloutEngine`` (HF or vLLM) and keeps its contract: prompts in, a
``RolloutBatch`` out, every row a function of (prompt, seed, weights, the tool's outputs). It
knows nothing of sandboxes: it is handed ``run_cells``, a function from each rollout's cells so
far to their ``ToolResult`` (``ibpo_lit.rewards.python_tool.PythonTool`` in training and
evaluation: ``ibpo_lit.tool_use``).

One rollout, turn by turn (token ids in, token ids out, never re-tokenized, as verl's multi-turn
rollouts keep them):
    1. The engine samples from the prompt and everything so far, with ``close`` as a stop string.
    2. It stopped on EOS, or at the token budget: the rollout ends.
    3. It stopped on ``close`` and the text since the last tool turn holds ``open``, a cell, and
       ``close`` after it: the cell runs (with the rollout's earlier cells, for their state);
       ``output_template`` around its output is tokenized and appended, marked in ``tool_mask``
       (out of the loss and the importance ratio), and the next turn resumes after it. Past
       ``max_tool_calls`` a cell is left as text and not run.
    4. It stopped on ``close`` with no cell open (``close`` was the start of ``open``, as ```
       is the start of ```python): the next turn simply continues the text.
The response (all turns) is at most ``sampling.max_new_tokens`` tokens, tool turns included; a
rollout cut there is unfinished, as any.

Seeds: turn 0 uses the row's own seed, so a rollout that never calls the tool is exactly the
wrapped engine's; turn t > 0 uses ``turn_seed(seed, t)``. So a row's tokens still depend only on
its prompt, seed, the weights and the tool's (deterministic) outputs: resume and the 1-vs-2
process equality hold as they do without tools.

Every process calls the wrapped engine equally often (a call is a collective under FSDP2 and
vLLM tensor parallelism): the processes agree each turn whether any row anywhere is still going
(``sync.any``), and a process with none calls with no prompts.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

from ibpo_lit.models.untrusted_text import text_ids
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.rollout.engine import RolloutEngine, SamplingConfig, check_generate_args

_SEED_STRIDE = 0x9E3779B97F4A7C15  # the golden-ratio increment (splitmix64): turns' seeds far apart
_SEED_MOD = 2**63


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of turn ``turn`` of the rollout seeded ``seed`` (turn 0: ``seed``)."""
    return seed if turn == 0 else (int(seed) + turn * _SEED_STRIDE) % _SEED_MOD


@dataclass(frozen=True)
class ToolConfig:
    """Tool-integrated rollouts (``model.rollout.tools``; docs/tools.md): the policy may run Python
    mid-solution in the code sandbox and read its output.

    Args:
        open: The text that opens a code cell (a markdown fence by default).
        close: The text that closes it; generation pauses there. Must not be empty.
        output_template: What is appended after a cell: ``{output}`` is what it printed (and
            its traceback's tail on an error), ending in a newline when not empty.
        max_tool_calls: Cells run per rollout; later cells stay text, not run.
        max_turns: Engine calls per rollout at most (a cell, and each stop on ``close`` that
            opened no cell, takes one); past it the rollout ends unfinished. None:
            ``4 * (max_tool_calls + 1)``.
        timeout_s: Wall-clock limit of one call (the rollout's earlier cells replayed, then the
            new one).
        memory_mb: Memory limit of the interpreter.
        max_output_chars: What the policy reads of one cell's output, at most.
        workers: Cells run at once, per process.
    """

    open: str = "```python"
    close: str = "```"
    output_template: str = "\n```output\n{output}```\n"
    max_tool_calls: int = 4
    max_turns: Optional[int] = None
    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 1024
    workers: int = 4

    def __post_init__(self) -> None:
        if not self.open or not self.close:
            raise ValueError("rollout.tools.open and close must not be empty")
        if "{output}" not in self.output_template:
            raise ValueError(f"rollout.tools.output_template must contain {{output}}, got {self.output_template!r}")
        if self.max_tool_calls < 1:
            raise ValueError(f"rollout.tools.max_tool_calls must be >= 1, got {self.max_tool_calls}")
        if self.max_turns is not None and self.max_turns < self.max_tool_calls + 1:
            raise ValueError(f"rollout.tools.max_turns must be >= max_tool_calls + 1 ({self.max_tool_calls + 1}), "
                             f"got {self.max_turns}")

    @property
    def turns(self) -> int:
        return self.max_turns if self.max_turns is not None else 4 * (self.max_tool_calls + 1)


class ToolOutput(Protocol):
    """What ``run_cells`` returns per rollout (``ibpo_lit.rewards.python_tool.ToolResult``)."""

    text: str
    seconds: float

    @property
    def failed(self) -> bool: ...


@dataclass
class ToolStats:
    """The last ``generate`` call's tool use, per row (B rows): cells run, of them failed (an
    error, timeout, memory or harness failure), their sandbox seconds; and the seconds the calls
    took on this process (``wall_s``, the cells of a turn run in parallel)."""

    calls: list[int] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def merged(self, other: "ToolStats") -> "ToolStats":
        return ToolStats(self.calls + other.calls, self.errors + other.errors, self.seconds + other.seconds,
                         self.wall_s + other.wall_s)

    def metrics(self) -> dict[str, float]:
        """``rollout/tool_calls`` and ``rollout/tool_errors`` per rollout, ``rollout/tool_call_s``
        per call, ``timing/tool_s``."""
        rows, calls = max(len(self.calls), 1), sum(self.calls)
        return {"rollout/tool_calls": calls / rows, "rollout/tool_errors": sum(self.errors) / rows,
                "rollout/tool_call_s": sum(self.seconds) / calls if calls else 0.0, "timing/tool_s": self.wall_s}


@dataclass
class _Row:
    prompt: list[int]
    seed: int
    ids: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    tool: list[bool] = field(default_factory=list)
    cells: list[str] = field(default_factory=list)
    since_tool: int = 0  # where the text after the last tool turn starts, in ``ids``
    turns: int = 0
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    done: bool = False
    finished: bool = False
    pending: Optional[str] = None  # the cell this turn closed, to run


class ToolRollouts(RolloutEngine):
    """A ``RolloutEngine`` whose rollouts may call a tool (module docstring).

    Args:
        engine: The engine that samples (HF or vLLM); it must honour ``SamplingConfig.stop``.
        tokenizer: The policy's tokenizer: reads the text for cells, tokenizes tool turns.
        run_cells: Each rollout's cells so far -> its newest cell's result, for a batch.
        config: The tool settings.
        any_rank: ``any_rank(flag)`` is True when ``flag`` is True on any process (a collective;
            ``RankSync.any``); in one process, ``bool``.
    """

    def __init__(self, engine: RolloutEngine, tokenizer, run_cells: Callable[[list[list[str]]], Sequence[ToolOutput]],
                 config: ToolConfig, any_rank: Callable[[bool], bool] = bool) -> None:
        self.engine, self.tokenizer, self.run_cells, self.config = engine, tokenizer, run_cells, config
        self.any_rank = any_rank
        self.eos_token_ids = set(int(i) for i in engine.eos_token_ids)
        self.pad_token_id = engine.pad_token_id
        self.last_stats = ToolStats()
        self.total_stats = ToolStats()  # every call since the engine was built (evaluate reports it)

    @property
    def sampling(self) -> SamplingConfig:
        return self.engine.sampling

    @property
    def context_limit(self) -> Optional[int]:
        return self.engine.context_limit

    def sync_weights(self, named_tensors) -> None:
        self.engine.sync_weights(named_tensors)

    def close(self) -> None:
        """Stop the tool's workers, then the wrapped engine (where it has a ``close``)."""
        for owner in (self.run_cells, self.engine):
            close = getattr(owner, "close", None)
            if close is not None:
                close()

    def __getattr__(self, name):  # the wrapped engine's own (sleep, close, model, ...)
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    def generate(self, prompts: Sequence[Sequence[int]], n: int, seeds: Sequence[int],
                 sampling: SamplingConfig | None = None) -> RolloutBatch:
        sampling = sampling or self.engine.sampling
        check_generate_args(prompts, n, seeds)
        budget = sampling.max_new_tokens
        turn_sampling = dataclasses.replace(sampling, stop=tuple(dict.fromkeys((*sampling.stop, self.config.close))))
        rows = [_Row(prompt=[int(t) for t in p], seed=int(s)) for p, s in zip((p for p in prompts for _ in range(n)), seeds)]
        wall = 0.0
        first = self.engine.generate(prompts, n, seeds, turn_sampling)  # turn 0: the engine's own rollouts
        stops = tuple(s for s in sampling.stop if s != self.config.close)
        self._absorb(rows, range(len(rows)), first, budget, stops)
        wall += self._run_pending(rows, budget)
        turn = 1
        while self.any_rank(any(not r.done for r in rows)):
            active = [i for i, r in enumerate(rows) if not r.done]
            left = [budget - len(rows[i].ids) for i in active]
            out = self.engine.generate([rows[i].prompt + rows[i].ids for i in active], 1,
                                       [turn_seed(rows[i].seed, turn) for i in active],
                                       dataclasses.replace(turn_sampling, max_new_tokens=max(left, default=1)))
            self._absorb(rows, active, out, budget, stops)
            wall += self._run_pending(rows, budget)
            turn += 1
        self.last_stats = ToolStats([r.calls for r in rows], [r.errors for r in rows], [r.seconds for r in rows], wall)
        self.total_stats = self.total_stats.merged(self.last_stats)
        if not rows:
            return RolloutBatch.empty(self.pad_token_id)
        return RolloutBatch.from_lists(
            prompts=[r.prompt for r in rows], responses=[r.ids for r in rows], logps=[r.logps for r in rows],
            finished=[r.finished for r in rows], seeds=[r.seed for r in rows],
            group_index=[p for p in range(len(prompts)) for _ in range(n)], pad_token_id=self.pad_token_id,
            tool_masks=[r.tool for r in rows],
        ).to(first.response_ids.device)

    def _absorb(self, rows: list[_Row], which, out: RolloutBatch, budget: int, stops: tuple[str, ...]) -> None:
        """Append one turn's tokens to ``rows[which]`` and decide each row's next move: done
        (EOS, the budget, a stop string of the user's, too many turns), a cell to run, or go on."""
        for i, ids, logps, finished in zip(which, out.response_lists(), _logp_lists(out), out.finished.tolist()):
            row = rows[i]
            row.turns += 1
            room = budget - len(row.ids)
            cut = len(ids) > room  # the turn was sampled to the longest row's budget: this one's is less
            ids, logps = ids[:room], logps[:room]
            row.ids += ids
            row.logps += logps
            row.tool += [False] * len(ids)
            if cut or not finished:  # at the budget (or this turn's max_new_tokens, which is the budget)
                row.done, row.finished = True, False
            elif ids and ids[-1] in self.eos_token_ids:
                row.done, row.finished = True, True
            elif stops and any(s in self.tokenizer.decode(ids, skip_special_tokens=False) for s in stops):
                row.done, row.finished = True, True  # a stop string of the sampling settings' own
            else:  # stopped on ``close``
                cell = self._closed_cell(row)
                if cell is not None and row.calls < self.config.max_tool_calls:
                    row.pending = cell
                if len(row.ids) >= budget or row.turns >= self.config.turns:
                    row.done, row.finished, row.pending = True, False, None  # no room to go on

    def _closed_cell(self, row: _Row) -> Optional[str]:
        """The code of the cell the text since the last tool turn opens and closes, or None."""
        text = self.tokenizer.decode(row.ids[row.since_tool:], skip_special_tokens=False)
        start = text.rfind(self.config.open)
        if start < 0:
            return None
        body = text[start + len(self.config.open):]
        end = body.find(self.config.close)
        return body[:end] if end >= 0 else None

    def _run_pending(self, rows: list[_Row], budget: int) -> float:
        """Run the cells this turn closed; append their outputs as tool turns. Returns seconds."""
        waiting = [r for r in rows if r.pending is not None]
        if not waiting:
            return 0.0
        start = time.perf_counter()
        results = self.run_cells([r.cells + [r.pending] for r in waiting])
        for row, result in zip(waiting, results):
            row.cells.append(row.pending)
            row.pending = None
            row.calls += 1
            row.errors += int(result.failed)
            row.seconds += float(result.seconds)
            ids = tool_turn_ids(self.tokenizer, self.config.output_template, result.text)
            room = budget - len(row.ids)
            row.ids += ids[:room]
            row.logps += [0.0] * len(ids[:room])
            row.tool += [True] * len(ids[:room])
            row.since_tool = len(row.ids)
            if len(ids) >= room:
                row.done, row.finished = True, False
        return time.perf_counter() - start


def tool_turn_ids(tokenizer, template: str, output: str) -> list[int]:
    """The token ids of the tool turn showing ``output``. A program's output is text: what it
    prints as a special token (``<|im_end|>``, a chat role marker) is split into ordinary
    tokens (`ibpo_lit.models.untrusted_text.text_ids`), so a cell can neither end the rollout nor
    forge a turn of the chat template."""
    output = output if not output or output.endswith("\n") else output + "\n"
    return text_ids(tokenizer, template.format(output=output))


def _logp_lists(batch: RolloutBatch) -> list[list[float]]:
    return [row[m].tolist() for row, m in zip(batch.rollout_logp, batch.response_mask)]


def tool_metrics(engine: RolloutEngine) -> dict[str, float]:
    """The last ``generate`` call's tool metrics (``ToolStats.metrics``); none for an engine
    without tools."""
    return engine.last_stats.metrics() if isinstance(engine, ToolRollouts) else {}


def unwrap(engine: RolloutEngine) -> RolloutEngine:
    """The engine that samples, under any ``ToolRollouts``."""
    return engine.engine if isinstance(engine, ToolRollouts) else engine

