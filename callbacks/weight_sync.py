"""``VLLMWeightSync``: keep a separate rollout engine (vLLM) on the policy's current weights.

When it syncs:
    * before the first rollout of every ``fit``: at the sanity check's validation or at
      ``on_train_start``, whichever comes first. Both come after Lightning restores a checkpoint
      under every strategy (``on_fit_start`` does not: under ``ModelParallelStrategy``, FSDP2,
      the restore comes after it), so a resumed run never samples from the engine's start-up
      weights. Which weights an engine holds is known in its own process only: a checkpoint's
      record of it is not restored;
    * after every ``every_n_steps``-th optimizer step (``on_train_batch_end``; 1 = on-policy;
      N > 1 lets rollouts lag the policy by up to N - 1 steps, which
      ``rollout/logprob_mismatch`` then shows);
    * before validation, when the engine is behind.

How: the policy's weights stream into the engine one full tensor at a time, under their
checkpoint names (``ibpo_lit.rollout.weights.iter_full_weights``: FSDP2 shards are gathered
one parameter at a time on every rank, packed MoE experts unpacked), then the engine resets its
prefix cache. ``rollout/sync_s`` logs the seconds. After each sync the callback checks that
every parameter and persistent buffer of the policy was sent (``StaleWeightsError`` naming the
missing ones otherwise): a tensor the sync never reaches stays stale in the engine, which a
16-token probe at a small learning rate would not notice.

Sleep mode (GPU, ``rollout.vllm.enable_sleep_mode``): before each update
(``on_before_update``) the engine sleeps, at level 2 (weights dropped) when a sync follows
this update, else level 1 (weights offloaded to CPU memory); the sync then wakes the weights,
loads the new ones and only then allocates the KV cache again (verl's and TRL's order). An
engine whose weights were dropped is always synced after the update, even when a skipped
(non-finite) step left the version unchanged.

The probe: after each sync, the engine samples ``probe_tokens`` tokens for a fixed prompt and
the trainer recomputes their log-probs; if the mean absolute difference exceeds
``probe_tolerance``, the engine holds stale or wrongly loaded weights and training stops with
``StaleWeightsError`` instead of learning from the wrong policy's samples. A fp32 engine
agrees with the trainer to float rounding; a bf16 engine to bf16's rounding, a few hundredths
per token, so the default tolerance of 0.1 catches weights that did not load without tripping
on precision. Raise it for low-precision engines of large models. The trainer's side runs
in the trainer's own precision context (autocast under ``bf16-mixed`` with one device or DDP;
FSDP2 casts its gathered weights itself), so the probe compares the engine with the forward the
update computes, not with an fp32 one.
``probe_every_n_syncs`` > 1 checks only every N-th sync (the first sync of every ``fit`` is
always checked): the probe costs a short generation plus a trainer forward per sync, about
5% of a SmolLM2 step on 2 CPU cores, which a long run may not want to pay every step; on a
GPU it also runs at the step's tightest moment for memory (the engine awake with its KV cache
while the trainer gathers its layers), so the large configs probe every 10th sync.

What it reads of the module: ``pl_module.weight_sync_context()`` (a `WeightSyncContext`: the
engine, the policy, the tokenizer, the weights' version, mini-batches per update, the device,
the collectives), nothing else.

State saved in checkpoints: the weights version the engine last received and the number of
syncs (only the count is read back: a resumed process's engine has received nothing yet).
"""
from __future__ import annotations

import math
import time

import lightning as L
import torch

from ibpo_lit.rollout.engine import SamplingConfig
from ibpo_lit.rollout.weights import SyncManifest, WeightSyncContext, iter_full_weights
from ibpo_lit.scale.fsdp2 import is_sharded
from ibpo_lit.training.logprobs import response_logprobs


class StaleWeightsError(RuntimeError):
    """The rollout engine's log-probs disagree with the trainer's after a weight sync."""


class VLLMWeightSync(L.Callback):
    """Push the policy's weights into the module's rollout engine.

    Args:
        every_n_steps: Sync after every N-th optimizer step (1 = every step, on-policy).
        probe_prompt: Text of the fixed prompt checked after each sync.
        probe_tokens: Tokens sampled for the probe (0 disables the check).
        probe_tolerance: Largest mean |engine - trainer| log-prob per probe token accepted.
        probe_seed: Sampling seed of the probe.
        probe_every_n_syncs: Check the probe on every N-th sync of a ``fit`` (its first sync
            always).
    """

    def __init__(
        self,
        every_n_steps: int = 1,
        probe_prompt: str = "The capital of France is",
        probe_tokens: int = 16,
        probe_tolerance: float = 0.1,
        probe_seed: int = 1234,
        probe_every_n_syncs: int = 1,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"VLLMWeightSync.every_n_steps must be >= 1, got {every_n_steps}")
        if probe_tokens < 0 or not probe_tolerance > 0:
            raise ValueError("VLLMWeightSync needs probe_tokens >= 0 and probe_tolerance > 0")
        if probe_every_n_syncs < 1:
            raise ValueError(f"VLLMWeightSync.probe_every_n_syncs must be >= 1, got {probe_every_n_syncs}")
        self.probe_every_n_syncs = probe_every_n_syncs
        self.every_n_steps = every_n_steps
        self.probe_prompt = probe_prompt
        self.probe_tokens = probe_tokens
        self.probe_tolerance = probe_tolerance
        self.probe_seed = probe_seed
        self.synced_version: int | None = None  # weights version the engine holds
        self.syncs = 0
        self.last_seconds = 0.0
        self.last_probe_mismatch = float("nan")
        self.last_probed = False  # whether the last sync ran the probe
        self.fit_syncs = 0  # syncs since this fit started: the probe's cadence counts these

    # ------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fit_syncs = 0
        self.synced_version = None  # this fit's engine holds nothing of ours yet

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After any restore, before the first rollout: fresh start and resume alike.
        ctx = pl_module.weight_sync_context()
        if self.synced_version != ctx.weights_version:
            self.sync_engine(ctx)

    def on_before_update(self, trainer, pl_module, step) -> None:
        ctx = pl_module.weight_sync_context()
        if not getattr(ctx.engine, "can_sleep", False):
            return
        ahead = ctx.weights_version + ctx.num_mini_batches - (self.synced_version or 0)
        ctx.engine.sleep(level=2 if ahead >= self.every_n_steps else 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        ctx = pl_module.weight_sync_context()
        behind = ctx.weights_version - (self.synced_version or 0)
        if behind >= self.every_n_steps or getattr(ctx.engine, "weights_discarded", False):
            self.sync_engine(ctx)
            metrics = {"rollout/sync_s": self.last_seconds}
            if self.last_probed:
                metrics["rollout/probe_mismatch"] = self.last_probe_mismatch
            # Straight to the loggers, at this step only (see GradientVarianceLogger).
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def on_validation_start(self, trainer, pl_module) -> None:
        ctx = pl_module.weight_sync_context()
        if self.synced_version != ctx.weights_version:
            self.sync_engine(ctx)

    # ------------------------------------------------------------------- sync
    def sync_engine(self, ctx: WeightSyncContext) -> None:
        """Stream the policy's weights into the engine and check the probe."""
        start = time.perf_counter()
        manifest = SyncManifest()
        if hasattr(ctx.engine, "incoming_weights_version"):  # an engine that names the version in its errors
            ctx.engine.incoming_weights_version = ctx.weights_version
        with torch.no_grad():
            ctx.engine.sync_weights(iter_full_weights(ctx.policy, manifest, dtype=getattr(ctx.engine, "weights_dtype", None)))
        self.last_seconds = time.perf_counter() - start
        if manifest.missing():
            raise StaleWeightsError(
                f"the weight sync did not send {len(manifest.missing())} of the policy's tensors "
                f"({', '.join(manifest.missing()[:5])}...): the engine would keep their old values"
            )
        self.synced_version = ctx.weights_version
        self.syncs += 1
        self.last_probed = bool(self.probe_tokens) and self.fit_syncs % self.probe_every_n_syncs == 0
        self.fit_syncs += 1
        if self.last_probed:
            self.last_probe_mismatch = self.check_probe(ctx)

    def check_probe(self, ctx: WeightSyncContext) -> float:
        """Mean |engine - trainer| log-prob of the probe's sampled tokens, the worst over the
        run's processes; raises ``StaleWeightsError`` above the tolerance, on every process."""
        ids = ctx.tokenizer(self.probe_prompt, add_special_tokens=False)["input_ids"]
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=self.probe_tokens)
        batch = ctx.engine.generate([ids], n=1, seeds=[self.probe_seed], sampling=sampling)
        batch = batch.to(ctx.device)
        was_training = ctx.policy.training
        ctx.policy.eval()
        try:
            with torch.no_grad(), ctx.forward_context():
                trainer_logp = response_logprobs(
                    ctx.policy, batch, temperature=1.0, single_pass=is_sharded(ctx.policy)
                ).float()
        finally:
            ctx.policy.train(was_training)
        mask = batch.policy_mask
        mine = float(((trainer_logp - batch.rollout_logp).abs() * mask).sum() / mask.sum().clamp(min=1))
        # One verdict for every rank: a rank that raised alone would leave the others waiting
        # in their next collective. The worst rank decides (NaN worst of all).
        per_rank = ctx.sync.gather(mine)
        rank, mismatch = max(enumerate(per_rank), key=lambda item: math.inf if math.isnan(item[1]) else item[1])
        if not mismatch <= self.probe_tolerance:  # NaN fails too
            where = f" (process {rank} of {len(per_rank)})" if len(per_rank) > 1 else ""
            raise StaleWeightsError(
                f"after syncing weights version {ctx.weights_version}, the rollout engine's log-probs "
                f"on the probe prompt differ from the trainer's by {mismatch:.4f} per token{where} (tolerance "
                f"{self.probe_tolerance}): the engine holds stale or wrongly loaded weights, and its rollouts "
                "would not come from the policy being trained. Check rollout.vllm.dtype against model.dtype, "
                "or raise VLLMWeightSync.probe_tolerance if a low-precision engine is intended."
            )
        return mismatch

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        return {"synced_version": self.synced_version, "syncs": self.syncs}

    def load_state_dict(self, state_dict: dict) -> None:
        # Not `synced_version`: the engine of the process that saved it is gone, and under FSDP2
        # the restore comes after `on_fit_start`, so reading it back would mark the new engine,
        # which holds the start-up weights, as holding the restored ones (issue 31).
        self.syncs = state_dict.get("syncs", 0)
