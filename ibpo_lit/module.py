"""``IBPOModule``: the LightningModule that sequences one GSPO(+IBPO) training step.

One ``training_step`` is one rollout batch (see README, "One training step"):

1. sample ``G`` responses per prompt with the rollout engine;
2. score them with the verifier (``None`` becomes NaN: unscorable, ignored by statistics);
3. hand a ``ScoredRollouts`` to every callback that defines
   ``on_rollouts_scored(trainer, pl_module, step)``, in callback order. This is the one hook
   Lightning lacks between "rollouts are scored" and "loss is computed"; the
   ``callbacks.CorrectionRollouts`` callback fills ``step.corrections`` there. Removing that
   callback turns corrections off;
4. shape rewards (IBPO) and compute group advantages;
5. update the policy: ``num_mini_batches`` optimizer steps, each accumulated over
   micro-batches whose losses sum exactly to the mini-batch loss.

The module holds no formula: every one lives in ``ibpo_lit.algorithms``.
"""
from __future__ import annotations

import copy
import math
import os
import tempfile
import time
from typing import Any, Optional

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from ibpo_lit.algorithms.advantages import grouped_advantages
from ibpo_lit.algorithms.registry import POLICY_LOSSES
from ibpo_lit.algorithms.schedule import warmup_cosine
from ibpo_lit.algorithms.shaping import shape_rewards
from ibpo_lit.ciw_scoring import CIWScorer
from ibpo_lit.config import AlgorithmConfig, OptimConfig, RolloutConfig
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.models.loading import (
    BUILTIN_MODELS,
    build_builtin_model,
    eos_token_ids,
    load_policy,
    load_sharded_policy,
    resolve_model_path,
)
from ibpo_lit.policy_logprobs import response_logprobs
from ibpo_lit.rewards import RewardPool, get_reward
from ibpo_lit.rng_state import capture_rng_state, restore_rng_state
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.rollout.engine import RolloutEngine
from ibpo_lit.rollout.hf import HFRolloutEngine
from ibpo_lit.scale.collectives import RankSync
from ibpo_lit.scale.fsdp2 import FSDP2Plan, fp32_rotary_buffers, is_sharded
from ibpo_lit.scale.launch_env import export_rank_env
from ibpo_lit.scale.strategy import sharding_plan
from ibpo_lit.seeding import MAIN_ROLLOUTS, VALIDATION, rollout_seeds
from ibpo_lit.step import ScoredRollouts, UpdateBatch

# Metrics that count events on each rank: summed over ranks, not averaged.
# (``train/loss``: each rank's micro-batch losses are its share of the global mini-batch loss.)
SUMMED_METRICS = ("train/unscorable", "train/corrections", "train/tokens_per_s", "train/reward_timeouts",
                  "train/reward_errors", "train/reward_none", "train/loss")


class NonFiniteError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient norm."""


class IBPOModule(L.LightningModule):
    """GSPO with IBPO reward shaping on any Hugging Face causal LM.

    Args:
        model: A Hugging Face model id, a local model directory, or a built-in name
            (``tiny-llama``: a small random model made in code, for tests).
        dtype: Weights' dtype when loading (``float32`` or ``bfloat16``); mixed precision
            is ``trainer.precision``.
        algorithm: Loss, advantages and IBPO shaping.
        rollout: Sampling and how the rollout batch is split into updates.
        optim: Optimizer and learning-rate schedule.
        reward: Verifier by name (``math``: math-verify against the gold answer).
        reward_workers: Worker processes that run the verifier (each item killed at its timeout).
        reward_timeout_s: Hard time limit per scored response; a response that runs past it (or
            whose verifier raises or returns None) is unscorable: NaN, ignored by the group
            statistics, counted in ``train/unscorable``.
        val_samples: Responses sampled per validation prompt (``val/accuracy`` is their mean
            reward: avg@k), with the rollouts' decoding settings and fixed seeds.
        max_nonfinite_steps: Stop after this many consecutive steps whose loss or gradient
            norm is not finite (each one is skipped and counted).
        gradient_checkpointing: Recompute activations in the backward pass to save memory.
        logprob_chunk_tokens: The trainer's forward applies the LM head to at most this many
            positions at a time (full-vocabulary logits of long rows never exist at once; see
            ``ibpo_lit.policy_logprobs``). Unset = one piece.
    """

    def __init__(
        self,
        model: str = "tiny-llama",
        dtype: str = "float32",
        algorithm: AlgorithmConfig = AlgorithmConfig(),  # noqa: B008 - frozen in use, never mutated
        rollout: RolloutConfig = RolloutConfig(),  # noqa: B008
        optim: OptimConfig = OptimConfig(),  # noqa: B008
        reward: str = "math",
        reward_workers: int = 1,
        reward_timeout_s: float = 5.0,
        val_samples: int = 1,
        max_nonfinite_steps: int = 5,
        gradient_checkpointing: bool = False,
        logprob_chunk_tokens: Optional[int] = 4096,
    ) -> None:
        super().__init__()
        self.model_name = model
        self.dtype_name = dtype
        self.algorithm = algorithm
        self.rollout_cfg = rollout
        self.optim_cfg = optim
        get_reward(reward)  # fails now, listing valid names, on a typo
        if reward_workers < 1 or not reward_timeout_s > 0:
            raise ValueError(
                f"reward_workers must be >= 1 and reward_timeout_s > 0, got {reward_workers}, {reward_timeout_s}"
            )
        if val_samples < 1:
            raise ValueError(f"val_samples must be >= 1, got {val_samples}")
        self.val_samples = val_samples
        self.reward_name = reward
        self.reward_workers = reward_workers
        self.reward_timeout_s = reward_timeout_s
        self._reward_pool: Optional[RewardPool] = None
        self.max_nonfinite_steps = max_nonfinite_steps
        self.gradient_checkpointing = gradient_checkpointing
        if logprob_chunk_tokens is not None and logprob_chunk_tokens < 1:
            raise ValueError(f"logprob_chunk_tokens must be >= 1 or unset, got {logprob_chunk_tokens}")
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.loss_fn = POLICY_LOSSES.get(self.algorithm.loss)
        self.save_hyperparameters()
        self.automatic_optimization = False

        self.policy: Optional[torch.nn.Module] = None
        self.ref_policy: Optional[torch.nn.Module] = None
        self.tokenizer = None
        self.engine: Optional[RolloutEngine] = None
        self.ciw_scorer: Optional[CIWScorer] = None
        self._plan: Optional[FSDP2Plan] = None  # FSDP2 sharding of the policy (None: replicated)
        self._engine_dir: Optional[tempfile.TemporaryDirectory] = None
        self.rollout_step = 0  # rollout batches done; saved in checkpoints (seeds depend on it)
        # Optimizer steps taken (skipped non-finite ones excluded): the version of the policy's
        # weights. A weight-sync callback records which version the engine holds.
        self.weights_version = 0
        self._nonfinite_run = 0
        self._nonfinite_total = 0
        self._reward_counts = {"timeout": 0, "error": 0, "none": 0}  # unscorable, by cause, before a resume
        self._pending_rng_state: Optional[dict] = None  # restored before the first step after a resume
        self._mismatch = [0.0, 0.0]
        self._warned_no_corrections = False
        self.step_stats: dict[str, float] = {}  # token counts and seconds of the last step (compute accounting)

    # ----------------------------------------------------------------- setup
    def configure_model(self) -> None:
        # Called by Lightning inside the strategy's context (FSDP shards from here); loading
        # here rather than in __init__ also means a bad config fails before any weights load.
        if self.policy is not None:
            if self.engine is None:
                self.engine = self._build_engine()
            return
        trainer = self._trainer
        self._plan = sharding_plan(trainer.strategy) if trainer is not None else None
        self.policy, self.tokenizer = self._load_policy()
        self.policy.train()  # from_pretrained returns eval mode; dropout is off either way (load_policy)
        if self.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.algorithm.beta_kl > 0:
            # Frozen copy of the initial policy; dropout is already off (see load_policy). A
            # sharded policy cannot be deep-copied: the reference is loaded and sharded the same way.
            if self._plan is not None:
                self.ref_policy = self._load_policy()[0].requires_grad_(False)
            else:
                self.ref_policy = copy.deepcopy(self.policy).requires_grad_(False)
        if trainer is not None and trainer.world_size > 1:
            export_rank_env(trainer)  # vLLM's external launcher reads RANK / LOCAL_RANK
        self.engine = self._build_engine()
        self.ciw_scorer = CIWScorer(self.algorithm.ciw, self.tokenizer) if self.algorithm.ciw is not None else None

    def _load_policy(self):
        if self._plan is not None:
            return load_sharded_policy(self.model_name, self._plan, dtype=self.dtype_name, seed=self.rollout_cfg.seed)
        return load_policy(self.model_name, dtype=self.dtype_name, seed=self.rollout_cfg.seed)

    @property
    def sync(self) -> RankSync:
        """Collectives over the run's processes (a no-op in one process)."""
        return RankSync.from_trainer(self._trainer)

    @property
    def context_limit(self) -> Optional[int]:
        """Longest prompt + response the policy and the rollout engine take (None: unknown)."""
        limits = []
        positions = getattr(getattr(self.policy, "config", None), "max_position_embeddings", None)
        if isinstance(positions, int):
            limits.append(positions)
        if self.rollout_cfg.backend == "vllm" and self.rollout_cfg.vllm.max_model_len is not None:
            limits.append(self.rollout_cfg.vllm.max_model_len)
        return min(limits) if limits else None

    @property
    def uniform_forwards(self) -> bool:
        """Whether every forward of the policy is a collective (FSDP2), so that each rank must
        run as many as the others: one pass per log-prob call, pass counts agreed on."""
        return is_sharded(self.policy)

    def _build_engine(self) -> RolloutEngine:
        cfg = self.rollout_cfg
        if cfg.backend == "hf":
            return HFRolloutEngine(
                self.policy,
                eos_token_ids=eos_token_ids(self.policy, self.tokenizer),
                pad_token_id=self.tokenizer.pad_token_id,
                sampling=cfg.sampling,
                reshard_after_forward=self._plan.reshard_after_forward if self._plan is not None else True,
            )
        from ibpo_lit.rollout.vllm_engine import VLLMRolloutEngine

        if self.model_name in BUILTIN_MODELS:
            # Models built in code have no directory: give vLLM one (its weights are replaced
            # by the policy's at the first sync anyway). Each rank builds an unsharded copy.
            self._engine_dir = tempfile.TemporaryDirectory(prefix="ibpo_lit_engine_")
            # Written with safetensors directly: save_pretrained writes on global rank 0 only.
            from safetensors.torch import save_model

            model = build_builtin_model(self.model_name, self.dtype_name, self.rollout_cfg.seed)
            model.config.save_pretrained(self._engine_dir.name)
            save_model(model, os.path.join(self._engine_dir.name, "model.safetensors"))
            path = self._engine_dir.name
        else:
            path = resolve_model_path(self.model_name)
        return VLLMRolloutEngine(
            path,
            eos_token_ids=eos_token_ids(self.policy, self.tokenizer),
            pad_token_id=self.tokenizer.pad_token_id,
            sampling=cfg.sampling,
            config=cfg.vllm,
            torch_dtype=self.dtype_name,
        )

    def on_fit_start(self) -> None:
        # After the strategy's precision plugin cast the module (bf16-true casts buffers too).
        fp32_rotary_buffers(self.policy)
        if self.rollout_cfg.backend != "hf" and not any(
            callable(getattr(cb, "sync_engine", None)) for cb in self.trainer.callbacks
        ):
            raise ValueError(
                f"rollout.backend={self.rollout_cfg.backend!r} samples from a separate copy of the "
                "weights, but no callback syncs them: add callbacks.VLLMWeightSync to trainer.callbacks "
                "(without it every rollout would come from the initial weights)."
            )

    def configure_optimizers(self):
        cfg = self.optim_cfg
        total = cfg.total_steps or (self.trainer.max_steps if self.trainer.max_steps > 0 else None)
        if total is None:
            raise ValueError(
                "set trainer.max_steps (or optim.total_steps): the cosine schedule needs the number of optimizer steps"
            )
        warmup = int(round(cfg.warmup_ratio * total))
        params = [p for p in self.policy.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
            fused=use_fused_adamw(params, cfg.fused),
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, total, warmup, cfg.min_lr_ratio)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------ one step
    def training_step(self, prompts: list[Prompt], batch_idx: int) -> None:
        if self._pending_rng_state is not None:
            # Resumed: every global RNG continues where the checkpoint left it. Here rather than
            # at load time: Lightning draws from torch's generator in between (a new DataLoader
            # iterator), where an uninterrupted run does not.
            restore_rng_state(self._pending_rng_state)
            self._pending_rng_state = None
        t_start = time.perf_counter()
        # Every forward of this step counts (callbacks' extra passes included).
        self.step_stats = {"trained_tokens": 0, "no_grad_tokens": 0}
        G = self.rollout_cfg.group_size
        step_index = self.rollout_step

        # 1. rollouts
        seeds = rollout_seeds(self.rollout_cfg.seed, step_index, MAIN_ROLLOUTS, len(prompts) * G, rank=self.global_rank)
        rollouts = self.engine.generate([p.prompt_ids for p in prompts], n=G, seeds=seeds)
        texts = self.tokenizer.batch_decode(rollouts.response_lists(), skip_special_tokens=True)
        t_generated = time.perf_counter()

        # 2. rewards
        group = rollouts.group_index.tolist()
        rewards = self.score(texts, [prompts[g] for g in group])
        step = ScoredRollouts(prompts=prompts, rollouts=rollouts, texts=texts, rewards=rewards, step=step_index)

        # 3. callbacks that act between scoring and the loss (corrections)
        self._call_step_hooks("on_rollouts_scored", step)
        t_corrected = time.perf_counter()

        # 4. shaping and advantages; then callbacks that read the finished step
        metrics = self._shape_and_assemble(step)
        self._call_step_hooks("on_before_update", step)
        t_hooks = time.perf_counter()

        # 5. updates (a vLLM engine in sleep mode has freed its memory: see VLLMWeightSync)
        self._mismatch = [0.0, 0.0]  # (sum of |engine - trainer| log-prob, tokens)
        metrics.update(self._update(step.update))
        metrics["rollout/logprob_mismatch"] = self._mismatch_metric(step.update)
        t_end = time.perf_counter()

        correction_tokens = step.corrections.generated_tokens if step.corrections is not None else 0
        generated = int(rollouts.response_mask.sum())
        self.step_stats.update(
            {
                "prompt_tokens": int(rollouts.prompt_mask.sum()),
                "generated_tokens": generated,
                "correction_tokens": correction_tokens,
                "correction_prompt_tokens": step.corrections.prompt_tokens if step.corrections is not None else 0,
                "step_seconds": t_end - t_start,
            }
        )
        metrics.update(
            {
                "train/response_len": rollouts.response_lengths.float().mean().item(),
                "train/truncated_frac": 1.0 - rollouts.finished.float().mean().item(),
                "train/tokens_per_s": (generated + correction_tokens) / max(t_end - t_start, 1e-9),
                "timing/generate_s": t_generated - t_start,
                "timing/correct_s": t_corrected - t_generated,
                "timing/callbacks_s": t_hooks - t_corrected,
                "timing/update_s": t_end - t_hooks,
                "timing/step_s": t_end - t_start,
            }
        )
        counts = self._reward_totals()
        metrics.update({"train/reward_timeouts": float(counts["timeout"]), "train/reward_errors": float(counts["error"]),
                        "train/reward_none": float(counts["none"])})
        metrics["train/nonfinite_steps"] = float(self._nonfinite_total)  # a count, not a mean over mini-batches
        metrics.update(self._data_counts())
        self._log_metrics(metrics)
        self.rollout_step += 1

    def validation_step(self, prompts: list[Prompt], batch_idx: int) -> None:
        """avg@k on held-out prompts: the same seeds at every validation, so two checkpoints
        differ only by their weights."""
        k = self.val_samples
        seeds = rollout_seeds(self.rollout_cfg.seed, batch_idx, VALIDATION, len(prompts) * k, rank=self.global_rank)
        rollouts = self.engine.generate([p.prompt_ids for p in prompts], n=k, seeds=seeds)
        texts = self.tokenizer.batch_decode(rollouts.response_lists(), skip_special_tokens=True)
        rewards = self.score(texts, [prompts[g] for g in rollouts.group_index.tolist()])
        scored = rewards.nan_to_num(0.0)  # an unscorable response counts as wrong here
        n = len(rewards)
        self.log("val/accuracy", scored.mean(), on_epoch=True, batch_size=n, prog_bar=True, sync_dist=True)
        self.log("val/response_len", rollouts.response_lengths.float().mean(), on_epoch=True, batch_size=n,
                 sync_dist=True)

    def score(self, texts: list[str], prompts: list[Prompt]) -> Tensor:
        """Verifier rewards, [len(texts)] float on the CPU; NaN where a text cannot be scored
        (timed out, raised, or returned None)."""
        if self._reward_pool is None:
            self._reward_pool = RewardPool(self.reward_name, num_workers=self.reward_workers, timeout_s=self.reward_timeout_s)
        values = self._reward_pool.score([(text, prompt.gold) for text, prompt in zip(texts, prompts)])
        return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)

    def teardown(self, stage: str) -> None:
        if self._reward_pool is not None:
            self._reward_pool.close()
            self._reward_pool = None
        close = getattr(self.engine, "close", None)
        if callable(close):  # while the process groups it uses exist; rebuilt if used again
            close()
            self.engine = None

    def _call_step_hooks(self, name: str, step: ScoredRollouts) -> None:
        """ibpo-lit's own callback hooks, called in callback order on every callback that
        defines them: ``on_rollouts_scored`` (rewards known, loss not yet: corrections) and
        ``on_before_update`` (advantages known: metrics, gradient variance)."""
        for callback in self.trainer.callbacks:
            hook = getattr(callback, name, None)
            if callable(hook):
                hook(self.trainer, self, step)

    def _shape_and_assemble(self, step: ScoredRollouts) -> dict[str, float]:
        """Shaped rewards -> advantages for the rollouts, plus the correction samples when
        they are trained jointly; fills ``step.shaped_rewards``, ``step.delta`` and
        ``step.update`` and returns metrics."""
        algo = self.algorithm
        rollouts, rewards = step.rollouts, step.rewards
        corrections = step.corrections
        metrics: dict[str, float] = {"train/reward": _nanmean(rewards), "train/unscorable": float(rewards.isnan().sum())}

        shaped, token_weights, delta = rewards, None, torch.zeros_like(rewards)
        if algo.ibpo != "none" and corrections is None and not self._warned_no_corrections:
            rank_zero_warn(
                f"algorithm.ibpo={algo.ibpo!r} but no callback produced corrections (add "
                "callbacks.CorrectionRollouts to trainer.callbacks): training without IBPO shaping."
            )
            self._warned_no_corrections = True
        if algo.ibpo != "none" and corrections is not None:
            result = shape_rewards(
                rewards,
                corrections.rewards,
                corrections.rewrite,
                corrections.kept_mask.cpu(),
                rollouts.response_mask.cpu(),
                variant=algo.ibpo,
                lam=algo.ibpo_lambda,
                beta=algo.ibpo_beta,
            )
            shaped, token_weights, delta = result.shaped_rewards, result.token_weights, result.delta
            metrics["train/shaped_frac"] = float((result.delta > 0).float().mean())
        metrics["train/shaped_reward"] = _nanmean(shaped)
        if corrections is not None:
            metrics.update(corrections.metrics)

        advantages = grouped_advantages(shaped, rollouts.group_index.cpu(), scale=algo.advantage_scale)
        batch = rollouts
        if corrections is not None and corrections.train_batch is not None and len(corrections.train_batch):
            extra = corrections.train_batch
            # Correction groups are numbered after the prompts' so the two never mix.
            extra_groups = extra.group_index + int(rollouts.group_index.max()) + 1
            extra_adv = grouped_advantages(
                corrections.train_rewards, extra_groups.cpu(), scale=algo.advantage_scale
            )
            batch = RolloutBatch.concat([rollouts, extra], pad_token_id=self.tokenizer.pad_token_id)
            advantages = torch.cat([advantages, extra_adv])
            if token_weights is not None:
                lr = batch.response_ids.shape[1]
                token_weights = torch.cat(
                    [
                        torch.nn.functional.pad(token_weights, (0, lr - token_weights.shape[1]), value=1.0),
                        torch.ones(len(extra), lr),
                    ]
                )
            metrics["train/correction_reward"] = _nanmean(corrections.train_rewards)
        if self.ciw_scorer is not None:
            # pi_old's counterfactual drops weight the tokens of every row that gets a gradient
            # (a zero-advantage row gets none, whatever its weights).
            ciw = self.ciw_scorer(
                self.policy, batch.to(self.device), rows=(advantages != 0), step=self.rollout_step,
                temperature=self._temperature, sync=self.sync if self.uniform_forwards else None,
            )
            token_weights = ciw.weights if token_weights is None else token_weights * ciw.weights
            metrics.update(ciw.metrics)
            self.step_stats["no_grad_tokens"] += int(ciw.metrics.get("ciw/forward_tokens", 0))
        metrics["train/zero_adv_frac"] = float((advantages == 0).float().mean())
        step.shaped_rewards, step.delta = shaped, delta
        step.update = UpdateBatch(batch=batch, advantages=advantages, token_weights=token_weights)
        return metrics

    # -------------------------------------------------------------- updates
    def _update(self, update: UpdateBatch) -> dict[str, float]:
        """``num_mini_batches`` optimizer steps over the update batch; returns averaged metrics."""
        cfg = self.rollout_cfg
        device = self.device
        batch = update.batch.to(device)
        advantages = update.advantages.to(device)
        token_weights = update.token_weights.to(device) if update.token_weights is not None else None

        old_logp = None
        if cfg.old_logp == "rollout":
            old_logp = batch.rollout_logp
        elif cfg.num_mini_batches > 1:
            # pi_old must be the policy before the first update of this batch.
            old_logp = self._logprobs_no_grad(self.policy, batch)

        n = len(batch)
        generator = torch.Generator().manual_seed(cfg.seed * 7919 + self.rollout_step)
        order = torch.randperm(n, generator=generator) if cfg.num_mini_batches > 1 else torch.arange(n)
        totals: dict[str, float] = {}
        # tensor_split: exactly num_mini_batches optimizer steps on every rank, whatever its rows
        # (torch.chunk may return fewer parts than asked for).
        for mini in order.tensor_split(cfg.num_mini_batches):
            for key, value in self._mini_batch_step(batch, mini.to(device), advantages, token_weights, old_logp).items():
                totals[key] = totals.get(key, 0.0) + value / cfg.num_mini_batches
        return totals

    def _mini_batch_step(self, batch, rows, advantages, token_weights, old_logp) -> dict[str, float]:
        cfg, algo = self.rollout_cfg, self.algorithm
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        optimizer.zero_grad(set_to_none=True)

        # Global denominators: every micro-batch loss is a share of the mini-batch loss, over
        # the rows of every rank. DDP and FSDP average gradients over ranks, so each rank's
        # loss is scaled by the number of ranks to make the sum of shares the global mean.
        world = self.trainer.world_size
        num_seqs, num_tokens = self.sync.sum([float(len(rows)), float(batch.response_mask[rows].sum())])
        # A row with zero advantage contributes exactly zero loss and gradient (without a
        # KL term): skip its forward pass, but keep it in the denominators above.
        active = rows[advantages[rows] != 0] if algo.beta_kl == 0 else rows
        lengths = batch.response_mask[active].sum(dim=1) + batch.prompt_mask[active].sum(dim=1)
        active = active[torch.argsort(lengths, stable=True)]  # similar lengths share a micro-batch: less padding

        loss_total, weighted = 0.0, {}
        # (torch.split of an empty tensor yields one empty chunk, hence the guard)
        micros = list(active.split(cfg.micro_batch_size)) if len(active) else []
        # Under DDP/FSDP every backward (and under FSDP every forward) is a collective: all
        # ranks run as many micro-batches as the busiest one, the others with passes whose loss
        # is multiplied by 0 (the same forwards, nothing added to the gradient).
        for index in range(self.sync.max(len(micros))):
            padding = index >= len(micros)
            micro = torch.zeros(1, dtype=torch.long, device=rows.device) if padding else micros[index]
            loss, metrics = self.policy_loss(
                batch.select(micro),
                advantages[micro],
                token_weights[micro] if token_weights is not None else None,
                old_logp[micro] if old_logp is not None else None,
                num_seqs=num_seqs,
                num_tokens=num_tokens,
                bookkeeping=not padding,
            )
            if padding:
                self.manual_backward(loss * 0.0)
                continue
            self.manual_backward(loss * world)
            loss_total += float(loss.detach())
            for key, value in metrics.items():
                weighted[key] = weighted.get(key, 0.0) + float(value) * len(micro)

        grad_norm = self._clip_and_check()
        finite = math.isfinite(loss_total) and math.isfinite(grad_norm)
        finite = not self.sync.any(not finite)  # every rank skips, or none: the replicas stay equal
        if not finite:
            # Skip the update but keep the step count: params with no grad are left as they are.
            optimizer.zero_grad(set_to_none=True)
            self._nonfinite_run += 1
            self._nonfinite_total += 1
            if self._nonfinite_run >= self.max_nonfinite_steps:
                raise NonFiniteError(
                    f"{self._nonfinite_run} consecutive optimizer steps had a non-finite loss ({loss_total}) "
                    f"or gradient norm ({grad_norm}); stopping. Lower optim.lr, check trainer.precision, "
                    "or raise max_nonfinite_steps."
                )
        else:
            self._nonfinite_run = 0
            self.weights_version += 1
        optimizer.step()
        scheduler.step()

        out = {(k if "/" in k else f"train/{k}"): v / max(len(active), 1) for k, v in weighted.items()}
        out.update(
            {
                "train/loss": loss_total,
                "train/grad_norm": grad_norm,
                "train/lr": scheduler.get_last_lr()[0],
                "train/nonfinite_steps": float(self._nonfinite_total),
            }
        )
        return out

    def policy_loss(
        self,
        batch: RolloutBatch,
        advantages: Tensor,
        token_weights: Optional[Tensor] = None,
        old_logp: Optional[Tensor] = None,
        num_seqs: Optional[float] = None,
        num_tokens: Optional[float] = None,
        bookkeeping: bool = True,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Forward ``batch`` (trimmed to its own padding) and return the configured loss.

        ``advantages`` [n]; ``token_weights`` and ``old_logp`` [n, >=Lr] (cut to the batch's
        response length); ``old_logp=None`` means on-policy (``pi_old`` = this forward,
        detached). ``num_seqs``/``num_tokens`` are the global denominators (default: this
        batch's own), so several calls' losses add up to one batch's loss. ``bookkeeping=False``
        (a padding pass) leaves the token counters and the mismatch metric alone.
        """
        algo = self.algorithm
        batch = batch.trimmed()
        logp = self._logprobs(self.policy, batch)
        width = logp.shape[1]
        if bookkeeping:
            self.step_stats["trained_tokens"] = self.step_stats.get("trained_tokens", 0) + _sequence_tokens(batch)
        old = old_logp[:, :width] if old_logp is not None else logp.detach()
        if self.rollout_cfg.old_logp == "trainer" and bookkeeping:
            self._record_mismatch(old, batch)
        kwargs: dict[str, Any] = {"eps_low": algo.eps_low, "eps_high": algo.eps_high}
        if algo.loss == "grpo":
            if algo.agg_mode is not None:
                kwargs["agg_mode"] = algo.agg_mode
            if algo.beta_kl > 0:
                kwargs["beta_kl"] = algo.beta_kl
                with torch.no_grad():
                    kwargs["ref_logp"] = self._logprobs(self.ref_policy, batch)
                if bookkeeping:
                    self.step_stats["no_grad_tokens"] = self.step_stats.get("no_grad_tokens", 0) + _sequence_tokens(batch)
        return self.loss_fn(
            logp,
            old,
            advantages,
            batch.response_mask,
            token_weights=token_weights[:, :width] if token_weights is not None else None,
            num_seqs=num_seqs if num_seqs is not None else float(len(batch)),
            num_tokens=num_tokens if num_tokens is not None else float(batch.response_mask.sum()),
            **kwargs,
        )

    def _logprobs(self, model: torch.nn.Module, batch: RolloutBatch) -> Tensor:
        """The trainer's response log-probs [B, Lr] (gradient as the caller's mode allows)."""
        return response_logprobs(
            model, batch, self._temperature, single_pass=self.uniform_forwards, chunk_tokens=self.logprob_chunk_tokens
        )

    def _record_mismatch(self, trainer_logp: Tensor, batch: RolloutBatch) -> None:
        """Accumulate |engine log-prob - trainer log-prob| over the sampled tokens of ``batch``
        (``rollout/logprob_mismatch``: how far the engine's numerics, or stale weights, are
        from the policy the ratio is computed against)."""
        mask = batch.response_mask
        diff = (trainer_logp.detach().float() - batch.rollout_logp[:, : trainer_logp.shape[1]]).abs()
        self._mismatch[0] += float((diff * mask).sum())
        self._mismatch[1] += float(mask.sum())

    def _mismatch_metric(self, update: UpdateBatch) -> float:
        """The step's mean mismatch; when no row was forwarded (every advantage zero), one
        no-grad forward of a micro-batch measures it (on every rank when forwards are
        collectives and any rank needs it)."""
        if self.rollout_cfg.old_logp != "trainer":
            return math.nan
        needed = self._mismatch[1] == 0 and len(update.batch) > 0
        if self.uniform_forwards and self.sync.any(needed):
            rows = torch.arange(max(min(len(update.batch), self.rollout_cfg.micro_batch_size), 1))
            batch = update.batch.select(rows).to(self.device)
            with torch.no_grad():
                logp = self._logprobs(self.policy, batch)
            if needed:
                self._record_mismatch(logp, batch)
                self.step_stats["no_grad_tokens"] += _sequence_tokens(batch)
        elif needed:
            rows = torch.arange(min(len(update.batch), self.rollout_cfg.micro_batch_size))
            batch = update.batch.select(rows).to(self.device)
            self._record_mismatch(self._logprobs_no_grad(self.policy, batch), batch)
        return self._mismatch[0] / max(self._mismatch[1], 1.0)

    def _clip_and_check(self) -> float:
        """Clip by the global gradient norm (over DTensor shards, the norm of the whole
        gradient, the same on every rank) and return it."""
        params = [p for p in self.policy.parameters() if p.grad is not None]
        if not params:
            return 0.0
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        full = getattr(norm, "full_tensor", None)
        return float(full() if callable(full) else norm)

    @property
    def _temperature(self) -> float:
        return self.rollout_cfg.sampling.temperature

    @torch.no_grad()
    def _logprobs_no_grad(self, model: torch.nn.Module, batch: RolloutBatch) -> Tensor:
        """Log-probs [B, Lr] in micro-batches; with collective forwards every rank runs as many
        passes as the busiest (the extra ones on its first row, discarded)."""
        chunks = list(torch.arange(len(batch), device=batch.response_ids.device).split(self.rollout_cfg.micro_batch_size))
        passes = self.sync.max(len(chunks)) if self.uniform_forwards else len(chunks)
        out = []
        for index in range(passes):
            if index >= len(chunks):
                self._logprobs(model, batch.select(torch.zeros(1, dtype=torch.long)))
                continue
            logp = self._logprobs(model, batch.select(chunks[index]))
            out.append(torch.nn.functional.pad(logp, (0, batch.response_ids.shape[1] - logp.shape[1])))
            self.step_stats["no_grad_tokens"] = self.step_stats.get("no_grad_tokens", 0) + _sequence_tokens(
                batch.select(chunks[index])
            )
        if not out:
            return torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=batch.response_ids.device)
        return torch.cat(out)

    # ----------------------------------------------------------- logging/ckpt
    def _reward_totals(self) -> dict[str, int]:
        """Unscorable responses of the whole run by cause (a resumed run adds its checkpoint's)."""
        live = self._reward_pool.stats if self._reward_pool is not None else {}
        return {k: v + live.get(k, 0) for k, v in self._reward_counts.items()}

    def _data_counts(self) -> dict[str, float]:
        """The DataModule's counters (bad records skipped, long prompts skipped or truncated)."""
        stats = getattr(getattr(self.trainer, "datamodule", None), "stats", None)
        if not isinstance(stats, dict):
            return {}
        out = {f"data/{k}": float(v) for k, v in stats.items()}
        out["data/skipped"] = float(stats.get("skipped_records", 0) + stats.get("skipped_long_prompts", 0))
        return out

    def _log_metrics(self, metrics: dict[str, float]) -> None:
        """Log a step's metrics, averaged over ranks (counts summed; see ``SUMMED_METRICS``)."""
        metrics = self.sync.mean_metrics(metrics, summed=SUMMED_METRICS)
        bar = {"train/reward", "train/correction_success", "train/unscorable", "train/nonfinite_steps", "data/skipped"}
        for key, value in metrics.items():
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            self.log(key, float(value), on_step=True, prog_bar=key in bar, batch_size=1)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["ibpo_lit"] = {
            "rollout_step": self.rollout_step,
            "nonfinite_total": self._nonfinite_total,
            "weights_version": self.weights_version,
            "nonfinite_run": self._nonfinite_run,
            "reward_counts": self._reward_totals(),
            # Every rank's generators (a collective: Lightning calls this hook on every rank).
            "rng_per_rank": self.sync.gather(capture_rng_state()),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("ibpo_lit", {})
        self.rollout_step = state.get("rollout_step", 0)
        self._nonfinite_total = state.get("nonfinite_total", 0)
        self.weights_version = state.get("weights_version", 0)
        self._nonfinite_run = state.get("nonfinite_run", 0)
        self._reward_counts.update(state.get("reward_counts", {}))
        self._pending_rng_state = self._own_rng_state(state)
        self.configure_model()

    def _own_rng_state(self, state: dict) -> Optional[dict]:
        """This rank's saved generators; none when the run's size changed (each rank's streams
        are its own, so another rank's state would be the wrong one)."""
        per_rank = state.get("rng_per_rank")
        if per_rank is None:  # a checkpoint from before per-rank states: rank 0's only
            return state.get("rng") if self.global_rank == 0 else None
        world = self._trainer.world_size if self._trainer is not None else 1
        if len(per_rank) != world:
            rank_zero_warn(
                f"the checkpoint holds the random generators of {len(per_rank)} processes and this run has "
                f"{world}: they are not restored (ibpo-lit's own sampling does not depend on them)."
            )
            return None
        return per_rank[self.global_rank]


def _sequence_tokens(batch: RolloutBatch) -> int:
    """Real (unpadded) prompt + response tokens of a batch: what a forward pass processes."""
    return int(batch.prompt_mask.sum()) + int(batch.response_mask.sum())


def _nanmean(values: Tensor) -> float:
    finite = values[~values.isnan()]
    return float(finite.mean()) if finite.numel() else math.nan


def use_fused_adamw(params: list[Tensor], requested: Optional[bool]) -> bool:
    """Whether AdamW runs its fused kernel: ``requested`` when set, else on when every
    parameter is a plain floating tensor on CPU or CUDA. DTensor shards (FSDP2) stay on the
    default kernel unless asked for: torch's fused support for them varies by version.
    Asking for the kernel on a device or dtype it does not support is an error here, with
    the reason, rather than deep inside the first ``optimizer.step``."""
    from torch.distributed.tensor import DTensor

    unsupported = next(
        (f"{p.dtype} parameter on {p.device.type}" for p in params
         if p.device.type not in ("cpu", "cuda") or not p.is_floating_point()),
        None,
    )
    if requested and unsupported:
        raise ValueError(f"optim.fused=true, but torch's fused AdamW does not support a {unsupported}; unset it")
    if requested is not None:
        return requested
    return unsupported is None and not any(isinstance(p, DTensor) for p in params)
