"""Training compute, logged every step and optionally used as a budget (METHOD section 6).

The paper compares GSPO (G = 64) with IBPO+GSPO (G = 8) at matched training compute,
generation and correction included. After every training step this callback adds up:

- **accelerator-seconds**: the measured wall time of ``IBPOModule.training_step``
  (``step_stats.step_seconds``: generation, corrections, callbacks and updates) times the
  devices of the run (``trainer.num_devices * trainer.num_nodes``); CPU-seconds on the CPU;
- **FLOPs**: ``diagnostics.estimate_flops`` on the step's token counts: rollout and correction
  prompts and generations (2N per token), trained tokens (6N), extra no-grad forwards (2N).

It logs ``compute/device_seconds``, ``compute/flops`` (cumulative), ``compute/step_flops``,
``compute/step_device_seconds``, ``compute/generated_tokens`` and ``compute/trained_tokens``
(cumulative), so any metric can be plotted against compute, and sets
``trainer.should_stop`` once a budget is reached. The totals are saved in checkpoints, so a
resumed run continues its budget (a resumed run whose budget is already spent stops before
its first step). Budgets themselves come from the config, not the checkpoint: raise them to
train on.

Not covered: time spent outside ``training_step`` (data loading, checkpointing, logging);
FLOPs are parameter-FLOPs estimates (see ``ibpo_lit/algorithms/diagnostics.py``); the FLOPs
of ``GradientVarianceLogger``'s extra gradients are not in the module's token counts (their
seconds are). ``N`` is the parameters a token passes through (`ibpo_lit.models.parameters`:
every parameter of a dense model, the shared part and ``top_k / num_experts`` of the experts
of a mixture of experts); under FSDP2 each is a DTensor, whose ``numel()`` is its global size,
so N is the whole model's on every rank (checked in tests/scale/test_fsdp2.py). Under several processes token counts are summed over ranks and step seconds
averaged, so every rank takes the same stop decision.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from ibpo_lit.algorithms.diagnostics import estimate_flops
from ibpo_lit.models.parameters import active_parameters

class ComputeBudgetStopper(Callback):
    """Logs cumulative training compute and stops the run at a compute budget.

    Args:
        max_device_seconds: Stop once the accelerator-seconds (step wall seconds x devices)
            reach this; unset = no time budget.
        max_flops: Stop once the estimated FLOPs reach this; unset = no FLOPs budget.
        log_every: Log the ``compute/*`` metrics every this many steps (the totals are
            updated every step). With both budgets unset the callback only logs.
    """

    def __init__(
        self,
        max_device_seconds: Optional[float] = None,
        max_flops: Optional[float] = None,
        log_every: int = 1,
    ) -> None:
        for name, value in (("max_device_seconds", max_device_seconds), ("max_flops", max_flops)):
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"ComputeBudgetStopper.{name} must be a positive number or unset, got {value!r}")
        if not isinstance(log_every, int) or log_every < 1:
            raise ValueError(f"ComputeBudgetStopper.log_every must be an integer >= 1, got {log_every!r}")
        self.max_device_seconds = max_device_seconds
        self.max_flops = max_flops
        self.log_every = log_every
        self.device_seconds = 0.0
        self.flops = 0.0
        self.generated_tokens = 0
        self.trained_tokens = 0
        self.steps = 0
        self.stop_reason: Optional[str] = None
        self._n_params: Optional[int] = None
        self._warned_no_stats = False

    # ------------------------------------------------------------------ hooks
    def on_train_start(self, trainer, pl_module) -> None:
        # A resumed run may have spent its budget already: stop before the first step.
        self._check_budget(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
        stats = pl_module.step_stats  # the step's tokens and seconds (`IBPOModule.step_stats`)
        if stats.step_seconds is None:
            if not self._warned_no_stats:
                rank_zero_warn(
                    "ComputeBudgetStopper: the module reports no step_stats.step_seconds; compute is not counted."
                )
                self._warned_no_stats = True
            return
        if self._n_params is None:
            self._n_params = active_parameters(pl_module.policy)  # a MoE's routed share, not all experts
        flops = estimate_flops(
            self._n_params,
            prompt_tokens=stats.prompt_tokens + stats.correction_prompt_tokens,
            generated_tokens=stats.generated_tokens + stats.correction_tokens,
            trained_tokens=stats.trained_tokens,
            no_grad_tokens=stats.no_grad_tokens,
        )["total"]
        # One collective per step: [flops, generated tokens, trained tokens, step seconds].
        local = torch.tensor(
            [
                flops,
                float(stats.generated_tokens + stats.correction_tokens),
                float(stats.trained_tokens),
                float(stats.step_seconds),
            ],
            dtype=torch.float64,
        )
        step = self._reduce(trainer, local)
        step_flops = float(step[0])
        step_seconds = float(step[3]) / max(trainer.world_size, 1) * trainer.num_devices * trainer.num_nodes
        self.flops += step_flops
        self.device_seconds += step_seconds
        self.generated_tokens += int(step[1])
        self.trained_tokens += int(step[2])
        self.steps += 1

        stopping = self._check_budget(trainer)
        if self.steps % self.log_every == 0 or stopping:
            log = {
                "compute/device_seconds": self.device_seconds,
                "compute/flops": self.flops,
                "compute/step_flops": step_flops,
                "compute/step_device_seconds": step_seconds,
                "compute/generated_tokens": float(self.generated_tokens),
                "compute/trained_tokens": float(self.trained_tokens),
            }
            for key, value in log.items():
                pl_module.log(key, value, on_step=True, on_epoch=False, batch_size=1)

    # ------------------------------------------------------------- budget
    def _check_budget(self, trainer) -> bool:
        """Set ``trainer.should_stop`` (and say why, once) when a budget is reached."""
        reason = None
        if self.max_device_seconds is not None and self.device_seconds >= self.max_device_seconds:
            reason = (
                f"compute budget reached: {self.device_seconds:.1f} accelerator-seconds >= "
                f"max_device_seconds={self.max_device_seconds}"
            )
        elif self.max_flops is not None and self.flops >= self.max_flops:
            reason = f"compute budget reached: {self.flops:.3e} estimated FLOPs >= max_flops={self.max_flops:.3e}"
        if reason is None:
            return False
        trainer.should_stop = True
        if self.stop_reason is None:
            self.stop_reason = f"{reason} after {self.steps} steps; stopping."
            rank_zero_info(f"ComputeBudgetStopper: {self.stop_reason}")
        return True

    @staticmethod
    def _reduce(trainer, local: torch.Tensor) -> torch.Tensor:
        """Sum the per-step vector over ranks (identity in a single process)."""
        if trainer.world_size <= 1:
            return local
        device = trainer.strategy.root_device
        return trainer.strategy.reduce(local.to(device), reduce_op="sum").cpu()

    # --------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "device_seconds": self.device_seconds,
            "flops": self.flops,
            "generated_tokens": self.generated_tokens,
            "trained_tokens": self.trained_tokens,
            "steps": self.steps,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.device_seconds = float(state_dict.get("device_seconds", 0.0))
        self.flops = float(state_dict.get("flops", 0.0))
        self.generated_tokens = int(state_dict.get("generated_tokens", 0))
        self.trained_tokens = int(state_dict.get("trained_tokens", 0))
        self.steps = int(state_dict.get("steps", 0))
        self.stop_reason = None
