"""`InTrainerPool`: a reward scored in the trainer's own process, behind the pools' interface.

`ibpo_lit.rewards.WeightedRewards` sums rewards that each live in a pool answering ``score``,
``stats``, ``unscorable``, ``last_error`` and ``close``. Worker processes (`RewardPool`) suit
functions of strings; a reward model or a judge needs the trainer's device, its collectives and
its engine, so it runs here, in process, called with the same batch contract
(``fn(prompts, completions, **columns) -> list[float | None]``, `ibpo_lit.rewards.functions`).

What is covered: the same outcomes as the worker pools: a batch whose function raises or returns
the wrong number of values is unscorable as a whole (counted in ``error``), a single None/NaN (a
judge's reply that does not parse) in ``none``, a non-number or an infinity in ``error``; each
kind of failure logged once at WARNING, later ones at DEBUG. ``score`` is called even with no
responses (the function must still take part in the run's collectives).

What is not covered: a time limit (a model's forward cannot be killed without killing the
trainer; a hang is the run's hang) and isolation (the reward shares the trainer's memory).
"""
from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

from ibpo_lit.rewards.functions import RewardOutputError, check_values, reward_columns, stack_columns

logger = logging.getLogger(__name__)


class InTrainerPool:
    """Calls ``fn`` in this process, once per `score` call, with the batch contract.

    Args:
        reward: The reward's spec (``reward_model:...``), named in warnings and errors.
        fn: ``fn(prompts, completions, **columns) -> list[float | None]``; may have ``close()``.
    """

    def __init__(self, reward: str, fn: Callable) -> None:
        self.reward, self.fn = reward, fn
        self.stats: dict[str, int] = {"ok": 0, "timeout": 0, "error": 0, "none": 0}
        self.last_error: Optional[str] = None
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
        try:
            values, errors = check_values(self.fn(prompts, completions, **stack_columns(rows)), n)
        except RewardOutputError as e:
            return self._fail("bad output", str(e), n)
        except Exception as e:  # noqa: BLE001 - an unscorable batch, not a dead trainer
            return self._fail(f"raised {type(e).__name__}", f"raised {type(e).__name__}: {e}", n)
        for i, message in errors.items():
            self._warn(message, f"{message}: unscorable (NaN), counted in train/reward_errors")
            self.last_error = message
        self.stats["error"] += len(errors)
        self.stats["none"] += sum(v is None for v in values) - len(errors)
        self.stats["ok"] += sum(v is not None for v in values)
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
