"""One step off-policy generation (``model.rollout.max_staleness: 1``, issue 44 item 3).

While step t updates the policy, a background thread generates step t+1's rollouts with the
engine's weights (step t's: the update has not reached the engine yet), scores them and runs
their correction rollouts (``on_rollouts_scored``). Step t joins the thread after its update
and before it returns, so the weight sync of ``on_train_batch_end`` (``callbacks.VLLMWeightSync``)
never runs while the engine is still generating, and a checkpoint written at the end of step t
holds step t+1's finished batch.

Design, as settled:

- **Prompts.** Lightning hands ``training_step`` one batch. With ``max_staleness: 1`` the data
  module hands a `StepPrompts` ``(now, ahead)`` (``ibpo_lit.data.lookahead``): this step's prompts
  and the next step's. It marks only ``now`` consumed, so its stateful resume stays where it was
  (a resumed stream yields ``(prompts_{k}, prompts_{k+1})`` again). Nothing reaches into
  Lightning's fetcher.
- **What runs at once.** The main thread's update (the policy, its optimizer, the trainer's
  device) beside the producer's generate (HTTP requests to ``backend: vllm_server``, an engine in
  processes of its own), scoring (reward worker processes) and correction rollouts (the same
  server). Only ``vllm_server`` is allowed: the ``hf`` engine samples from the very weights the
  update is changing, and a colocated ``vllm`` engine shares the trainer's device and memory.
- **Collectives.** The producer's work communicates across ranks: every ``generate`` of the
  ``vllm_server`` engine (its own rollouts and the correction rollouts) agrees on its deadline
  and polls its requests with all-reduces (`Deadline`, ``VLLMServerEngine._wait``: no rank left
  alone in a collective when the server dies), and tool turns agree whether any row still runs.
  Those run over a process group of the producer's own (`producer_sync`: gloo, every rank,
  created by the main thread of every rank in the same order when the engine is built, before
  any thread starts), never over the run's default group, where the main thread's update
  (DDP's / FSDP2's collectives) runs at the same time: two threads issuing collectives on one
  group interleave them differently on each rank. A group of its own rather than moving the
  collectives to the main thread: those waits are what bounds a generation that runs *during*
  the update (issue 44 item 4), so they cannot wait for the update to end. Gloo on the CPU: a
  few bytes a poll, kept off the GPU's NCCL streams the update uses. The engine's weight sync
  and its probe use the same group from the main thread, only after the producer is joined.
  What does reduce across ranks over the default group (the unscorable-streak check, the
  staleness's agreement, the metrics) runs on the main thread. A reward scored by a model in
  the trainer's processes (``reward_model:``, ``judge:``) runs sharded forwards on the default
  group: refused with several processes (``config_checks.off_policy_fits``).
- **Weights' version and staleness.** Every batch carries the weights version it was sampled
  with (``ScoredRollouts.weights_version``: the version the engine reports holding, else the
  trainer's at the start of sampling). At the update, `staleness` = (trainer's version - the
  batch's) / ``num_mini_batches`` (versions count optimizer steps; an update makes
  ``num_mini_batches`` of them) must not exceed ``max_staleness`` (`StalenessError`), and is
  logged as ``rollout/staleness``. Rollout correction (``model.rollout_correction``) must be on:
  its importance weights ``pi_old / pi_engine`` are what makes a lagging engine's samples usable.
- **Checkpoint.** The batch in flight (rollouts, texts, rewards, corrections, its reward
  metrics) goes into the checkpoint as plain tensors, lists and numbers (`in_flight_state`,
  loadable with ``weights_only=True``): regenerating it would need step t's weights, which the
  checkpoint (step t+1's) no longer holds. Every rank's (each samples its own prompts: gathered
  into the checkpoint, ``in_flight_per_rank``). A resumed run trains on its rank's, after
  checking it is the batch of the step and prompts the data module hands; a resume on another
  number of processes drops them and samples the step again (warned).
- **Overlap, shown.** ``time/*`` metrics, seconds from the step's start: ``time/ahead_start``,
  ``time/ahead_end`` (the producer), ``time/update_start``, ``time/update_end`` (the main
  thread), ``time/overlap_s`` (how long the two ran at once); ``timing/ahead_wait_s`` is what
  the main thread waited for the producer after its update (0: generation fully hidden).

What is not covered: lags above 1; dynamic sampling (its rounds decide after scoring whether
another batch is needed, which a batch generated ahead cannot know); engines other than
``vllm_server``; model-scored rewards with several processes. In one process a model-scored
reward (``reward_model:``, ``judge:`` with a model of its own) runs its forward in the producer,
on the trainer's device beside the update: allowed, but the plan (``ibpo_lit.plan``) does not count the two at once. The last step's batch ahead is
generated and never trained (it is in the final checkpoint, for a resume with more steps).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ibpo_lit.data.prompt import Prompt
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.scale.collectives import SINGLE_PROCESS, RankSync
from ibpo_lit.training.step_types import Corrections, ScoredRollouts


class StalenessError(RuntimeError):
    """A rollout batch lags the weights it would train by more than ``max_staleness``."""


@dataclass
class Produced:
    """A step's rollouts, scored and corrected, and what the step logs of that work."""

    scored: ScoredRollouts  # corrections filled, weights_version set
    reward_metrics: dict[str, float]  # ``reward/<name>`` of the rollouts' scoring
    tool_metrics: dict[str, float]  # ``rollout.tools``' (empty without)
    failure: Optional[list] = None  # ``[reward, its last error]`` of unscorable responses, or None
    seconds: dict[str, float] = field(default_factory=dict)  # generate, correct
    started: float = 0.0  # time.perf_counter() when generation began
    finished: float = 0.0  # ... and when the corrections were done


def staleness(trainer_version: int, sampled_version: int, num_mini_batches: int) -> float:
    """Updates between the weights a batch was sampled with and the weights it trains: versions
    count optimizer steps, ``num_mini_batches`` of them per update (a skipped, non-finite step
    counts none, so this can be below the number of steps in between, never above)."""
    return (trainer_version - sampled_version) / num_mini_batches


def check_staleness(value: float, max_staleness: int, step: int) -> None:
    """Raises `StalenessError` when ``value`` exceeds ``max_staleness``."""
    if value > max_staleness:
        raise StalenessError(
            f"rollout step {step}'s batch was sampled {value:g} updates behind the weights it would train, and "
            f"model.rollout.max_staleness is {max_staleness}: the engine was not synced after every update "
            "(callbacks.VLLMWeightSync.every_n_steps must be 1 with max_staleness > 0)")


def check_ranks_agree(lags: list[float], step: int) -> None:
    """Raises `StalenessError` unless every rank's staleness (``lags``, in rank order) is the same:
    the ranks train one update together, so their batches must come from the same weights."""
    if len(set(lags)) > 1:
        raise StalenessError(
            f"rollout step {step}'s batches lag by {', '.join(f'{x:g}' for x in lags)} updates on ranks "
            f"0..{len(lags) - 1}: the ranks' engines disagree on the weights they sampled with")


def producer_sync(world_size: int) -> RankSync:
    """The collectives of the thread generating ahead: every rank, over a gloo group of its own
    (module docstring, "Collectives"); `SINGLE_PROCESS` in one process. A collective itself
    (``new_group``): every rank calls it at the same point, from its main thread."""
    dist = torch.distributed
    if world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return SINGLE_PROCESS
    return RankSync(world_size, "cpu", group=dist.new_group(backend="gloo"))


class AheadOfUpdate:
    """Runs ``work()`` in one background thread; `join` returns its result or raises its error.

    A plain thread rather than an executor: one task per step whose start and end times the
    step logs, and nothing to shut down when a fit ends. Daemon: a run that dies mid-update
    (its error already raised) is not kept alive by a generation it no longer needs.
    """

    def __init__(self, work: Callable[[], Produced]) -> None:
        self._work = work
        self._result: Optional[Produced] = None
        self._error: Optional[BaseException] = None
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="ibpo-rollouts-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._work()
        except BaseException as err:  # handed to the main thread by `join`
            self._error = err

    def join(self) -> Produced:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result

    def wait(self) -> None:
        """Wait for the thread to end, whatever it returned or raised (the step is failing anyway)."""
        self._thread.join()


def overlap_metrics(clock: Any, ahead: Produced, lag: float) -> dict[str, float]:
    """``rollout/staleness`` and what shows the overlap: ``time/*``, seconds from the step's start
    (``clock.start``) at which the producer started and finished (``ahead_*``) and the update
    started and finished (``update_*``; the clock's ``callbacks`` and ``update`` marks);
    ``time/overlap_s``, the seconds the producer ran while the update did (0: none; across
    ranks the least, so > 0 means every rank overlapped); and the producer's own phases
    (``timing/ahead_generate_s``, ``timing/ahead_correct_s``)."""
    start = clock.start
    update_start, update_end = clock.marks["callbacks"], clock.marks["update"]
    return {
        "rollout/staleness": float(lag),
        "time/ahead_start": ahead.started - start, "time/ahead_end": ahead.finished - start,
        "time/update_start": update_start - start, "time/update_end": update_end - start,
        "time/overlap_s": max(0.0, min(ahead.finished, update_end) - max(ahead.started, update_start)),
        **{f"timing/ahead_{phase}_s": seconds for phase, seconds in ahead.seconds.items()},
    }


# ------------------------------------------------------------------------------- checkpoint
_TYPES = {cls.__name__: cls for cls in (Produced, ScoredRollouts, Corrections, RolloutBatch, Prompt)}
_TYPE_KEY = "__dataclass__"


def in_flight_state(produced: Produced) -> dict:
    """``produced`` as nested dicts, lists, tensors and numbers (a checkpoint entry that
    ``torch.load(weights_only=True)`` reads back; no pickled classes)."""
    return _encode(produced)


def in_flight_from_state(state: dict) -> Produced:
    """The `Produced` that `in_flight_state` wrote."""
    return _decode(state)


def _encode(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if name not in _TYPES:
            raise TypeError(f"cannot save a {name} in a checkpoint's batch in flight")
        return {_TYPE_KEY: name, **{f.name: _encode(getattr(value, f.name)) for f in fields(value)}}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, Tensor):
        return value.detach().cpu()
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and _TYPE_KEY in value:
        cls = _TYPES[value[_TYPE_KEY]]
        return cls(**{k: _decode(v) for k, v in value.items() if k != _TYPE_KEY})
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    return value
