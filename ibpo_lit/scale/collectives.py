"""What the ranks of a run agree on, one call at a time.

Under sharded training (FSDP2) every forward pass is a collective: each rank gathers the
parameters of a layer from the others. A rank that runs one forward fewer than the others
(it had no wrong rollout to correct, one cache hit more in CIW, one length bucket less) leaves
the others waiting for ever. So wherever a rank's amount of work depends on its own data, the
ranks first agree on the largest count (`RankSync.max`) and the lighter ranks pad with passes
that change nothing. Sums of denominators and metrics go through the same object.

`RankSync` is a no-op in one process (no process group), so single-process code calls it
unconditionally. Every method is a collective: all ranks must call the same methods in the same
order, which the callers guarantee by calling them at fixed points of a step.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import torch


class RankSync:
    """Collectives over every process of the run (identity when there is one).

    Args:
        world_size: Processes in the run.
        device: Where reduction tensors live (the rank's root device: NCCL reduces CUDA
            tensors, gloo CPU ones).
        group: The process group of every rank the collectives run over (None: the default
            one); a thread that communicates beside the main thread's collectives needs its own
            (``training.off_policy.producer_sync``).
    """

    def __init__(self, world_size: int = 1, device: torch.device | str = "cpu", group: Any = None) -> None:
        self.world_size = int(world_size)
        self.device = torch.device(device)
        self.group = group

    @staticmethod
    def from_trainer(trainer: Any) -> "RankSync":
        """The run's collectives, from a Lightning ``Trainer`` (one process without one)."""
        if trainer is None or trainer.world_size <= 1:
            return RankSync()
        return RankSync(trainer.world_size, trainer.strategy.root_device)

    @property
    def active(self) -> bool:
        return self.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()

    def _reduce(self, values: Sequence[float], op: str) -> list[float]:
        if not self.active:
            return [float(v) for v in values]
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor, op=getattr(torch.distributed.ReduceOp, op), group=self.group)
        return tensor.cpu().tolist()

    def max(self, value: int) -> int:
        """The largest ``value`` over the ranks."""
        return int(self._reduce([value], "MAX")[0])

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums of ``values`` over the ranks (same length on every rank)."""
        return self._reduce(values, "SUM")

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank."""
        return self.max(int(bool(flag))) > 0

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj, group=self.group)
        return out

    def reduce_metrics(self, metrics: dict[str, float], reduction: Callable[[str], Optional[str]]) -> dict[str, float]:
        """Each metric combined over the ranks that report a finite value for it (NaN where none
        does) by ``reduction(key)``: ``sum``, ``max``, ``min`` or ``mean`` (also for None). One
        collective; the keys may differ between ranks."""
        if not self.active:
            return dict(metrics)
        merged: dict[str, list[float]] = {}
        for rank_metrics in self.gather({k: float(v) for k, v in metrics.items() if v is not None}):
            for key, value in rank_metrics.items():
                merged.setdefault(key, []).append(value)
        out = {}
        for key, values in merged.items():
            finite = [v for v in values if math.isfinite(v)]
            how = reduction(key)
            if not finite:
                out[key] = math.nan
            elif how in ("sum", "max", "min"):
                out[key] = {"sum": sum, "max": max, "min": min}[how](finite)
            else:
                out[key] = sum(finite) / len(finite)
        return out


SINGLE_PROCESS = RankSync()
"""The `RankSync` of a run without process groups."""
