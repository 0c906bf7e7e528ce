"""`InTrainerPool`: a reward scored in the trainer's own process, behind the pools' interface.

`ibpo_lit.rewards.WeightedRewards` sums rewards that each live in a pool answering ``score``,
``stats``, ``unscorable``, ``last_error`` and ``close``. Worker processes (`RewardPool`) suit
functions of strings; a reward model or a judge needs the trainer's device, its collectives and
its engine, so it runs here, in process, called with the same batch contract
(``fn(prompts, completions, **columns) -> list[float | None]``, `ibpo_lit.rewards.functions`).

What is covered: the same outcomes as the worker pools: a batch whose function raises or returns
the wrong number of values is unscorable as a whole (counted in ``error``), a single None/NaN in
``none``, a non-number or an infinity in ``error``; each kind of failure logged once at WARNING,
later ones at DEBUG. ``score`` is called even with no responses (the function must still take
part in the run's collectives). A reward that reports its call (``last_report``, a
`ScoringReport`: the judges and reward models here) also has counted the responses it gave its
minimum because they broke it (``penalized``: scored, not unscorable; ``last_penalized`` for the
last call) and those its time limit left unscored (``timeout``, with the deadline's message as
``last_error``).

What is not covered: killing a hung forward (a model's forward in the trainer's process cannot be
killed without the trainer; the time limit is checked between batches, `ibpo_lit.scale.deadline`)
and isolation (the reward shares the trainer's memory).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ibpo_lit.errors import ConfigError
from ibpo_lit.rewards.functions import RewardOutputError, check_values, reward_columns, stack_columns

logger = logging.getLogger(__name__)


@dataclass
class ScoringReport:
    """What a model-scored reward says of its last call beyond its values (``last_report``).

    Args:
        penalized: Responses given the reward's minimum because they broke it (a judge's reply
            without a well-formed verdict, a question or text too long for the model).
        timed_out: Responses left unscored (None) because the time limit passed.
        timeout_message: The deadline's message (rank, phase, weights' version) when it passed.
    """

    penalized: int = 0
    timed_out: int = 0
    timeout_message: Optional[str] = None


def check_time_limit(value, where: str) -> None:
    """A reward's ``time_limit_s`` option: seconds > 0, or None (ConfigError naming ``where``)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value) or value <= 0):
        raise ConfigError(f"{where}: time_limit_s must be a number of seconds > 0 or null, got {value!r}")


class InTrainerPool:
    """Calls ``fn`` in this process, once per `score` call, with the batch contract.

    Args:
        reward: The reward's spec (``reward_model:...``), named in warnings and errors.
        fn: ``fn(prompts, completions, **columns) -> list[float | None]``; may have ``close()``.
    """

    def __init__(self, reward: str, fn: Callable) -> None:
        self.reward, self.fn = reward, fn
        self.stats: dict[str, int] = {"ok": 0, "timeout": 0, "error": 0, "none": 0, "penalized": 0}
        self.last_error: Optional[str] = None
        self.last_penalized = 0  # of the last `score` call
        self._warned: set[str] = set()

    @property
    def unscorable(self) -> dict[str, int]:
        return {k: self.stats[k] for k in ("timeout", "error", "none")}

    def score(self, pairs: Sequence[tuple[str, str]], prompts: Optional[Sequence[str]] = None,
              columns: Optional[Sequence[dict]] = None) -> list[Optional[float]]:
        """Score each (completion, gold) pair in one call of ``fn``; None where it could not be."""
        n = len(pairs)
        prompts = [""] * n if prompts is None else list(prompts)
        columns = [{}] * n if columns is None else list(columns)
        rows = [reward_columns(cols, gold) for (_, gold), cols in zip(pairs, columns)]
        completions = [completion for completion, _ in pairs]
        self.last_penalized = 0
        try:
            values, errors = check_values(self.fn(prompts, completions, **stack_columns(rows)), n)
        except RewardOutputError as e:
            return self._fail("bad output", str(e), n)
        except Exception as e:  # noqa: BLE001 - an unscorable batch, not a dead trainer
            return self._fail(f"raised {type(e).__name__}", f"raised {type(e).__name__}: {e}", n)
        for i, message in errors.items():
            self._warn(message, f"{message}: unscorable (NaN), counted in train/reward_errors")
            self.last_error = message
        report = getattr(self.fn, "last_report", None) or ScoringReport()
        if report.timed_out:
            self.last_error = report.timeout_message
            self._warn("timeout", f"{report.timeout_message}: {report.timed_out} response(s) left unscorable (NaN), "
                                  "counted in train/reward_timeouts")
        self.stats["error"] += len(errors)
        self.stats["timeout"] += report.timed_out
        self.stats["none"] += sum(v is None for v in values) - len(errors) - report.timed_out
        self.stats["ok"] += sum(v is not None for v in values)
        self.stats["penalized"] += report.penalized
        self.last_penalized = report.penalized
        return values

    def _fail(self, kind: str, message: str, n: int) -> list[None]:
        self.stats["error"] += n
        self.last_error = message
        self._warn(kind, f"{message}, on a batch of {n} response(s): unscorable (NaN), counted in train/reward_errors")
        return [None] * n

    def _warn(self, kind: str, message: str) -> None:
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        logger.log(level, "reward %r %s%s", self.reward, message,
                   "" if level == logging.DEBUG else "; more failures like this one are logged at DEBUG")

    def close(self) -> None:
        close = getattr(self.fn, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> InTrainerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
