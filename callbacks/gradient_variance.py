"""Policy-gradient variance of the update batch (METHOD section 6: the paper reports about
30% lower variance with IBPO than with plain GSPO).

Every ``every_n_steps`` rollout steps, at ``on_before_update`` (advantages known, weights not
yet updated), the rows of the update batch (rollouts and correction samples, zero-advantage
rows included: the estimator is over the batch as sampled) are shuffled with a seeded
generator and cut into ``K`` disjoint splits of near-equal size (``tensor_split``: sizes
differ by at most one). Each split's gradient is the gradient of the configured loss averaged
over that split alone, on-policy (``pi_old`` = the current weights, so this is the gradient of
the step's first update), on the selected parameters only: ``PolicyUpdate.group_gradients``
(``torch.autograd.grad``, so the module's ``.grad`` buffers are untouched), the only thing of
the module this callback calls besides reading ``policy``'s parameter names.
``diagnostics.gradient_variance`` turns the ``[K, D]`` gradients into
``grad_var/trace``, ``grad_var/mean_sq_norm`` and ``grad_var/relative``; the seconds it costs
are ``grad_var/seconds``.

With per-split means the size-weighted mean of the split gradients is the full-batch
gradient (the plain mean when the sizes are equal), so ``mean_sq_norm`` estimates the squared
norm of the step's gradient.

Cost and choices: ``K`` forward+backward passes over the batch, in the update's micro-batches;
rows with zero advantage give exactly zero gradient without a KL or entropy term, so their
forward is skipped (they still count in their split's mean), by the update's own rule.
``param_filter`` (a regex searched in parameter names) and ``max_params`` (the first ``n``
selected tensors) keep ``D`` small on large models: the ``K`` flattened gradients are held in
memory.

Not covered: distributed runs (several processes): sharded parameters and per-rank batches
would need collectives it does not do, so a run of several processes that lists it is refused
at config time (``requires_single_process``, `ibpo_lit.config_checks`). These
extra forwards are not counted in the module's token counts (``ComputeBudgetStopper``'s
FLOPs), only in its seconds.
"""
from __future__ import annotations

import math
import re
import time
from typing import Any, Optional

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from ibpo_lit.algorithms.diagnostics import gradient_variance
from ibpo_lit.seeds import stream_seed
from ibpo_lit.training.step_types import ScoredRollouts


class GradientVarianceLogger(Callback):
    """Logs the variance of the policy gradient across random splits of the update batch.

    Args:
        every_n_steps: Measure on rollout steps ``0, n, 2n, ...``.
        num_splits: K, the number of disjoint splits (>= 2); a step with fewer update rows
            than K is skipped.
        param_filter: Regex searched in parameter names (``re.search``); only matching
            trainable parameters are measured, e.g. ``"lm_head|layers\\.0\\."``. Unset = all.
        max_params: Keep only the first this many selected parameter tensors (model order).
        seed: Base seed of the split; the split of step ``s`` depends on ``(seed, s)`` only,
            so a resumed run measures the same splits. Unset: ``seed_everything``'s (0 without
            it; ``ibpo_lit.seeds``).
    """

    requires_single_process = True  # `ibpo_lit.config_checks` refuses it in a run of several processes

    def __init__(
        self,
        every_n_steps: int = 10,
        num_splits: int = 4,
        param_filter: Optional[str] = None,
        max_params: Optional[int] = None,
        seed: Optional[int] = None,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"GradientVarianceLogger.every_n_steps must be >= 1, got {every_n_steps}")
        if num_splits < 2:
            raise ValueError(f"GradientVarianceLogger.num_splits must be >= 2 (a variance needs two), got {num_splits}")
        if max_params is not None and max_params < 1:
            raise ValueError(f"GradientVarianceLogger.max_params must be >= 1 or unset, got {max_params}")
        if param_filter is not None:
            try:
                re.compile(param_filter)
            except re.error as err:
                raise ValueError(f"GradientVarianceLogger.param_filter is not a valid regex: {err}") from err
        self.every_n_steps = every_n_steps
        self.num_splits = num_splits
        self.param_filter = param_filter
        self.max_params = max_params
        self.seed = stream_seed(seed)
        self.last: Optional[dict[str, Any]] = None  # the latest measurement (tests, notebooks)
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ hook
    def on_before_update(self, trainer, pl_module, step: ScoredRollouts) -> None:
        if step.step % self.every_n_steps != 0 or step.update is None:
            return
        if trainer.world_size > 1:  # the config checks refuse this; a hand-built Trainer must not log one rank's share
            raise RuntimeError("GradientVarianceLogger measures one process only; remove it from a multi-process run")
        n = len(step.update.batch)
        if n < self.num_splits:
            self._warn_once(
                "few_rows", f"GradientVarianceLogger: {n} update rows < num_splits={self.num_splits}; step skipped."
            )
            return
        start = time.perf_counter()
        names, params = self.select_parameters(pl_module.policy)
        splits = self.split_rows(n, self.num_splits, self.seed, step.step)
        grads = pl_module.updater.group_gradients(step.update, splits, params)  # [K, D], each split's own mean
        stats = gradient_variance(grads)
        seconds = time.perf_counter() - start
        self.last = {
            "step": step.step,
            "splits": splits,
            "param_names": names,
            "num_elements": int(grads.shape[1]),
            "seconds": seconds,
            **stats,
        }
        metrics = {f"grad_var/{key}": stats[key] for key in ("trace", "relative", "mean_sq_norm") if math.isfinite(stats[key])}
        metrics["grad_var/seconds"] = seconds
        # Straight to the loggers, at this step only: through `pl_module.log`, Lightning
        # re-emits a step metric's last value on the steps in between, so a measurement
        # taken every N steps would appear N times.
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    # --------------------------------------------------------------- pieces
    def select_parameters(self, model: torch.nn.Module) -> tuple[list[str], list[Tensor]]:
        """Names and tensors of the trainable parameters measured (filter, then ``max_params``)."""
        pattern = re.compile(self.param_filter) if self.param_filter is not None else None
        chosen = [
            (name, p)
            for name, p in model.named_parameters()
            if p.requires_grad and (pattern is None or pattern.search(name))
        ]
        if self.max_params is not None:
            chosen = chosen[: self.max_params]
        if not chosen:
            raise ValueError(
                f"GradientVarianceLogger: no trainable parameter matches param_filter={self.param_filter!r}"
            )
        return [name for name, _ in chosen], [p for _, p in chosen]

    @staticmethod
    def split_rows(n: int, k: int, seed: int, step: int) -> list[Tensor]:
        """``k`` disjoint index tensors covering ``range(n)``: a seeded shuffle cut into
        near-equal parts (sizes differ by at most one)."""
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return list(torch.randperm(n, generator=generator).tensor_split(k))

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            rank_zero_warn(message)
            self._warned.add(key)
