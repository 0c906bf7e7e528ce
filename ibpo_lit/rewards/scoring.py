"""Several rewards summed with their weights (``model.rewards``).

Each reward is scored in its own pool, made by the caller (``ibpo_lit.tasks.scoring_pool``: the
sandbox for code, a `RewardPool` of worker processes for every other reward). The pools answer
``score(pairs, prompts=None, columns=None) -> list[float | None]`` (None: unscorable; the sandbox
needs only the (completion, gold) pairs), ``unscorable`` (counts by cause: ``timeout``,
``error``, ``none``), ``last_error`` (the latest failure's cause on one line, or None) and
``close()``.

`WeightedRewards` scores several rewards, each in its own pool, one after the other, and sums
them with their weights (`ibpo_lit.rewards.functions.combine`: a response unscorable in any
reward of non-zero weight is unscorable).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

from ibpo_lit.rewards.functions import RewardSpec, combine, reward_label
from ibpo_lit.rewards.pool import RewardPool
from ibpo_lit.rewards.sandbox.pool import SandboxPool


class WeightedRewards:
    """Several rewards, each scored in its own pool (``make_pool(name)``), summed with weights.

    ``last_parts`` holds each reward's values of the last `score` call by label (``reward/<label>``
    in the logs); ``stats`` and ``unscorable`` add up the pools' counts (a response unscorable in
    two rewards counts twice there, once in ``train/unscorable``); ``last_failure`` names the
    reward that left the last call's responses unscorable and its last error.
    """

    def __init__(self, specs: Sequence[RewardSpec], make_pool: Callable[[str], Union[RewardPool, SandboxPool]]):
        self.specs = list(specs)
        self.labels = [reward_label(s.name) for s in self.specs]
        self.pools: list[Union[RewardPool, SandboxPool]] = []
        self.last_parts: dict[str, list[Optional[float]]] = {}
        try:
            for spec in self.specs:
                self.pools.append(make_pool(spec.name))
        except BaseException:
            self.close()
            raise

    def score(self, pairs: Sequence[tuple[str, str]], prompts: Optional[Sequence[str]] = None,
              columns: Optional[Sequence[dict]] = None) -> list[Optional[float]]:
        """The weighted sum of the rewards of each (completion, gold) pair; None: unscorable."""
        parts = [pool.score(pairs, prompts, columns) for pool in self.pools]
        self.last_parts = dict(zip(self.labels, parts))
        return combine(parts, [s.weight for s in self.specs])

    @property
    def last_failure(self) -> Optional[tuple[str, Optional[str]]]:
        """``(reward, its last error)`` for the reward of non-zero weight that left the most
        responses of the last `score` call unscorable (the first such on a tie); None when
        every response was scored."""
        worst, missing = None, 0
        for spec, pool, values in zip(self.specs, self.pools, self.last_parts.values()):
            count = sum(v is None for v in values)
            if spec.weight != 0 and count > missing:
                worst, missing = (spec.name, getattr(pool, "last_error", None)), count
        return worst

    @property
    def last_penalized(self) -> dict[str, int]:
        """By label, for the pools that count them (judges and reward models): the responses of
        the last `score` call given the reward's minimum because they broke it."""
        return {label: pool.last_penalized for label, pool in zip(self.labels, self.pools)
                if hasattr(pool, "last_penalized")}

    @property
    def stats(self) -> dict[str, int]:
        """The pools' counts added up by key."""
        out: dict[str, int] = {}
        for pool in self.pools:
            for key, value in pool.stats.items():
                out[key] = out.get(key, 0) + value
        return out

    @property
    def unscorable(self) -> dict[str, int]:
        out = {"timeout": 0, "error": 0, "none": 0}
        for pool in self.pools:
            for key, value in pool.unscorable.items():
                out[key] = out.get(key, 0) + value
        return out

    def close(self) -> None:
        for pool in self.pools:
            pool.close()
        self.pools = []

    def __enter__(self) -> WeightedRewards:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
