"""``UnscorableStreak``: stop a run whose reward scores nothing, step after step.

A reward that fails on every call (it raises, hangs, returns the wrong number of values or not
a list, or the code sandbox cannot run on this host) makes every response unscorable (NaN). No
group then has an advantage, so the update has no gradient, and without this guard the run
would train on nothing to ``trainer.max_steps`` and exit 0. A reward that fails only sometimes
is not stopped: its unscorable responses are left out of the group statistics (docs/rewards.md).

What is covered:
- The count is of consecutive rollout batches (Lightning batches: with dynamic sampling, each
  generation round) in which every main rollout of every process is unscorable. The rewards
  are the reward pool's own values, read right after scoring: callbacks that change
  ``step.rewards`` later do not count, and neither do IBPO's correction rollouts (they are
  scored only when a group has a right and a wrong rollout, which an all-NaN step never has;
  a correction's failure says nothing about whether the main rollouts train).
- Every process adds its counts in one ``RankSync.sum`` per step, so all of them reach the same
  decision at the same step: a rank whose rows all failed while another's did not keeps going,
  and a stop raises on every rank together (nobody is left waiting in a collective).
- The error (`ibpo_lit.errors.UnscorableRewardsError`, one ``ibpo-lit: error:`` line) names the
  reward and its last error, from the first process (in rank order) that has one: a gather,
  run only at the stop, by every rank.
- ``state_dict`` / ``load_state_dict``: the streak survives a resume.

What is not covered: a reward that scores every response but always the same value (no
gradient either, yet not an error: dynamic sampling warns about it, and ``train/reward`` shows it).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from torch import Tensor

from ibpo_lit.errors import UnscorableRewardsError
from ibpo_lit.scale.collectives import RankSync


class UnscorableStreak:
    """Counts consecutive steps whose rollouts were all unscorable; stops the run at ``max_steps``.

    Args:
        max_steps: Consecutive all-unscorable steps that stop the run (``model.max_unscorable_steps``).
        reward_names: The run's rewards, named in the message when no process recorded an error.
    """

    def __init__(self, max_steps: int, reward_names: Sequence[str]) -> None:
        if max_steps < 1:
            raise ValueError(f"max_unscorable_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps
        self.reward_names = list(reward_names)
        self.run = 0  # consecutive all-unscorable steps so far

    def check(self, rewards: Tensor, sync: RankSync, failure: Optional[tuple[str, Optional[str]]]) -> None:
        """After a step's rollouts are scored (every rank, every step): ``rewards`` [n] this rank's
        (NaN: unscorable), ``failure`` this rank's ``(reward, last error)`` or None.

        Raises:
            UnscorableRewardsError: the ``max_steps``-th such step in a row, on every rank.
        """
        unscorable, total = sync.sum([float(rewards.isnan().sum()), float(rewards.numel())])
        if total == 0 or unscorable < total:
            self.run = 0
            return
        self.run += 1
        if self.run < self.max_steps:
            return
        known = [f for f in sync.gather(failure) if f is not None]
        name, error = known[0] if known else (", ".join(self.reward_names), None)
        cause = f" (last error: {error})" if error else ""
        raise UnscorableRewardsError(
            f"reward {name!r} could not score any response for {self.run} step{'s' if self.run > 1 else ''} in a "
            f"row{cause}; "
            "fix the reward or raise model.max_unscorable_steps"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"run": self.run}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run = int(state.get("run", 0))
