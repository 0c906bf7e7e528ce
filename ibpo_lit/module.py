"""``IBPOModule``: the LightningModule that sequences one GSPO(+IBPO) training step.

One ``training_step`` is one rollout batch (see README, "One training step"):

1. sample ``G`` responses per prompt with the rollout engine;
2. score them with the verifier (``None`` becomes NaN: unscorable, ignored by statistics);
3. hand a ``ScoredRollouts`` to every callback that defines
   ``on_rollouts_scored(trainer, pl_module, step)``, in callback order: the first of the two
   hooks Lightning lacks between "rollouts are scored" and "loss is computed" (the second,
   ``on_before_update``, sees the finished step before the update); the
   ``callbacks.CorrectionRollouts`` callback fills ``step.corrections`` there (with
   `correction_context`: what correcting needs from the run). Removing that callback turns
   corrections off;
4. shape rewards (IBPO) and compute advantages (``training.assemble``; REINFORCE++ with a KL
   first runs the reference's forward, the KL going into the reward), and CIW's token weights
   when configured;
5. update the policy (``training.update.PolicyUpdate``): ``num_mini_batches`` optimizer steps,
   each accumulated over micro-batches whose losses sum exactly to the mini-batch loss.

With ``rollout.max_staleness: 1`` (``training.off_policy``) steps 1-3 of the next step run in a
background thread during this step's 4-5, and this step trains the batch generated during the
last step's update; the batch in flight is saved in checkpoints. ``0``: the order above.

The module orchestrates: loading, the engine, the order of the steps, logging, checkpoint
state. The update loop and the step's parts live in ``ibpo_lit.training``, every formula in
``ibpo_lit.algorithms``.

Callbacks get narrow views rather than the module's internals: `correction_context` and
`weight_sync_context` (what correcting and syncing an engine need), ``updater``'s public methods
(``PolicyUpdate.group_gradients`` for gradient diagnostics), and, to read only, ``step_stats``,
``weights_version``, ``policy`` and ``tokenizer``.
"""
from __future__ import annotations

import copy
import math
import time
from contextlib import nullcontext
from dataclasses import replace
from typing import Optional

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from ibpo_lit.algorithms.advantages import rows_with_advantage
from ibpo_lit.config import AlgorithmConfig, OptimConfig, RolloutConfig, RolloutCorrectionConfig
from ibpo_lit.config_checks import check_fit_settings
from ibpo_lit.data.lookahead import StepPrompts
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.data.val_benchmarks import VAL_SET_KEY
from ibpo_lit.evaluation.metrics import avg_at_k, mean_pass_at_k
from ibpo_lit.models.attention import check_attn_implementation
from ibpo_lit.models.compile import compile_decoder_layers
from ibpo_lit.models.hf_compat import enable_activation_checkpointing
from ibpo_lit.models.lora import LoRAConfig, adapter_state, apply_lora
from ibpo_lit.models.loading import load_policy, load_sharded_policy, model_files
from ibpo_lit.model_rewards import ModelRewardContext, check_model_reward, model_reward_pool
from ibpo_lit.rewards import RewardSpec, WeightedRewards, model_scored_kind, resolve_specs
from ibpo_lit.rollout.engine import RolloutEngine
from ibpo_lit.rollout.factory import build_engine
from ibpo_lit.rollout.tools import tool_metrics, unwrap
from ibpo_lit.rollout.weights import WeightSyncContext
from ibpo_lit.scale.collectives import RankSync
from ibpo_lit.scale.fsdp2 import FSDP2Plan, fp32_rotary_buffers
from ibpo_lit.scale.launch_env import export_rank_env
from ibpo_lit.scale.strategy import sharding_plan
from ibpo_lit.seeds import check_resumed_seeds, run_seed, stream_seed
from ibpo_lit.tasks import get_task, scoring_pool
from ibpo_lit.tool_use import with_tools
from ibpo_lit.training.assemble import assemble_update
from ibpo_lit.training.ciw_scorer import CIWScorer
from ibpo_lit.training.corrections import CorrectionContext
from ibpo_lit.training.group_filter import InformativeGroups
from ibpo_lit.training.metric_reductions import reduction_of
from ibpo_lit.training.off_policy import (
    AheadOfUpdate,
    Produced,
    check_ranks_agree,
    check_staleness,
    in_flight_from_state,
    in_flight_state,
    overlap_metrics,
    producer_sync,
    staleness,
)
from ibpo_lit.training.optimizer import build_optimizer
from ibpo_lit.training.rng_state import capture_rng_state, restore_rng_state
from ibpo_lit.training.seeding import BENCHMARK_VALIDATION, MAIN_ROLLOUTS, VALIDATION, rollout_seeds
from ibpo_lit.training.step_metrics import StepClock, step_metrics
from ibpo_lit.training.step_types import ScoredRollouts, StepStats
from ibpo_lit.training.unscorable import UnscorableStreak
from ibpo_lit.training.update import PolicyUpdate, UpdateRuntime


class IBPOModule(L.LightningModule):
    """GSPO with IBPO reward shaping on any Hugging Face causal LM.

    Args:
        model: A Hugging Face model id, a local model directory, or a built-in name
            (``tiny-llama``: a small random model made in code, for tests).
        dtype: Weights' dtype when loading (``float32`` or ``bfloat16``); mixed precision
            is ``trainer.precision``.
        algorithm: Loss, advantages and IBPO shaping.
        rollout: Sampling and how the rollout batch is split into updates.
        rollout_correction: Importance weights between the trainer's and the engine's log-probs
            of the sampled tokens (TIS, MIS/RS; verl's names). Auto: on with
            ``rollout.backend: vllm``, off with ``hf`` (see ``RolloutCorrectionConfig``).
        optim: Optimizer and learning-rate schedule.
        reward: The reward: a built-in verifier by name (``math``: math-verify against the gold
            answer; ``code``: the gold's tests in the sandbox, docs/sandbox.md), an import path
            ``package.module:function`` called in batches as ``fn(prompts, completions,
            **columns) -> list[float | None]`` (TRL's convention; docs/rewards.md), or a model
            scoring in the trainer, on the policy's device (sharded under FSDP2):
            ``reward_model:<path or hub id>`` (an AutoModelForSequenceClassification with one
            label: its logit) or ``judge:<template or file>`` (the policy, or
            ``options.model``, asked with a template, its reply parsed; docs/reward_models.md).
            Unset: ``math``, unless ``rewards`` is set (setting both is an error). Scored through
            ``ibpo_lit.tasks.scoring_pool``, the pool evaluation uses too.
        rewards: Several rewards, ``[{name, weight, options}]`` (names as ``reward``; ``options``
            only for ``reward_model:`` and ``judge:``, e.g. ``{batch_size: 8}``, ``{model:
            path, parser: yes_no}``): the reward is their weighted sum, unscorable when any of
            non-zero weight is; each is logged as ``reward/<name>`` (an import path's function
            name, a reward model's folder name, ``judge_<template>``), ``train/reward`` is the sum.
        reward_workers: Responses scored at once (worker processes per reward; code: sandboxes).
        reward_timeout_s: Hard time limit per scored response (a batch of ``b`` responses gets
            ``b`` times it); a response that runs past it (or whose reward raises, returns None
            or a non-number, or whose batch came back with the wrong length) is unscorable: NaN,
            ignored by the group statistics, counted in ``train/unscorable``. Code is bounded by
            each program's own limits instead (the tests' ``timeout_s``), and a program's
            timeout is its score 0.
        reward_batch_size: Responses per call of an import-path reward, and per forward of a
            reward model (default 16 there). Unset: a scoring call's responses split evenly over
            ``reward_workers`` (one call per worker). Built-in rewards are called per response.
        val_samples: Responses sampled per validation prompt (``val/accuracy`` is their mean
            reward: avg@k), with the rollouts' decoding settings and fixed seeds.
        max_nonfinite_steps: Stop after this many consecutive steps whose loss or gradient
            norm is not finite (each one is skipped and counted).
        max_unscorable_steps: Stop, naming the reward and its last error, after this many
            consecutive steps in which the reward could score no response at all (every process's
            rollouts unscorable: it raised, hung, returned the wrong length or type, or the code
            sandbox cannot run); such steps have no gradient. A step with any scorable response
            resets the count; IBPO's corrections do not count (``training.unscorable``).
        gradient_checkpointing: Recompute activations in the backward pass to save memory.
        torch_compile: ``torch.compile`` each decoder layer for the trainer's forwards (regional
            compilation; TRL's ``torch_compile``, verl's ``use_torch_compile``): the first steps
            pay the compilation, generation stays eager. Whether it pays depends on the device:
            docs/benchmarks.md (``scripts/bench_update.py``).
        attn_implementation: The attention kernel of the trainer's policy and reference (and of
            the HF engine, which decodes with the policy): transformers' ``attn_implementation``,
            one of sdpa, eager, flex_attention, flash_attention_2/3/4 (installed separately);
            unset, the model's default (SDPA). ``rollout.packing: auto`` packs under
            flex_attention and flash-attention (docs/benchmarks.md#packed-forwards); the vLLM
            engine keeps its own kernels. TRL's ``model_init_kwargs.attn_implementation``.
        lora: Train low-rank adapters instead of every weight (``peft``; TRL's ``peft_config``,
            verl's ``lora_rank``): only the adapters are trained, stepped and checkpointed; the
            KL reference is the base with the adapters off; the vLLM sync sends the merged
            weights. Unset = full fine-tuning. Not with FSDP2.
        logprob_chunk_tokens: The trainer's forward applies the LM head to at most this many
            positions at a time (full-vocabulary logits of long rows never exist at once; see
            ``ibpo_lit.training.logprobs``). Unset = one piece.
    """

    def __init__(
        self,
        model: str = "tiny-llama",
        dtype: str = "float32",
        algorithm: AlgorithmConfig = AlgorithmConfig(),  # noqa: B008 - frozen in use, never mutated
        rollout: RolloutConfig = RolloutConfig(),  # noqa: B008
        optim: OptimConfig = OptimConfig(),  # noqa: B008
        reward: Optional[str] = None,
        rewards: Optional[list[RewardSpec]] = None,
        reward_workers: int = 1,
        reward_timeout_s: float = 5.0,
        reward_batch_size: Optional[int] = None,
        val_samples: int = 1,
        max_nonfinite_steps: int = 5,
        max_unscorable_steps: int = 3,
        gradient_checkpointing: bool = False,
        torch_compile: bool = False,
        attn_implementation: Optional[str] = None,
        logprob_chunk_tokens: Optional[int] = 4096,
        lora: Optional[LoRAConfig] = None,
        rollout_correction: RolloutCorrectionConfig = RolloutCorrectionConfig(),  # noqa: B008
    ) -> None:
        super().__init__()
        self.model_name = model
        self.dtype_name = dtype
        self.algorithm = algorithm
        # The seeds this module samples with, decided once, now (`ibpo_lit.seeds`): the run's
        # (seed_everything's) and model.rollout.seed, unset = the run's. Checkpoints record them.
        run = run_seed()
        self.rollout_cfg = replace(rollout, seed=stream_seed(rollout.seed, run))
        self.seeds = {"seed_everything": run, "model.rollout.seed": self.rollout_cfg.seed}
        self.optim_cfg = optim
        # Loads every reward now: a typo (listing valid names) or an import error fails here.
        self.reward_specs = resolve_specs(reward, rewards)
        for spec in self.reward_specs:  # reward_model: / judge: checked without loading weights
            if model_scored_kind(spec.name) is not None:
                check_model_reward(spec)
        if reward_workers < 1 or not reward_timeout_s > 0:
            raise ValueError(
                f"reward_workers must be >= 1 and reward_timeout_s > 0, got {reward_workers}, {reward_timeout_s}"
            )
        if reward_batch_size is not None and reward_batch_size < 1:
            raise ValueError(f"reward_batch_size must be >= 1 or unset, got {reward_batch_size}")
        if val_samples < 1:
            raise ValueError(f"val_samples must be >= 1, got {val_samples}")
        self.val_samples = val_samples
        self.reward_name = self.reward_specs[0].name if len(self.reward_specs) == 1 else None
        self.reward_workers = reward_workers
        self.reward_timeout_s = reward_timeout_s
        self.reward_batch_size = reward_batch_size
        # WeightedRewards: a scoring_pool per reward (the sandbox for code, worker processes otherwise)
        self._reward_pool: Optional[WeightedRewards] = None
        self._val_pools: dict = {}  # data.val_benchmarks: a scoring pool per benchmark's verifier
        self.max_nonfinite_steps = max_nonfinite_steps
        # Stops a run whose reward scores nothing (raises, hangs, ...) instead of training on no gradient.
        self.unscorable_streak = UnscorableStreak(max_unscorable_steps, [s.name for s in self.reward_specs])
        self.gradient_checkpointing = gradient_checkpointing
        self.torch_compile = torch_compile
        check_attn_implementation(attn_implementation)  # a typo fails before any weights load
        self.attn_implementation = attn_implementation
        if logprob_chunk_tokens is not None and logprob_chunk_tokens < 1:
            raise ValueError(f"logprob_chunk_tokens must be >= 1 or unset, got {logprob_chunk_tokens}")
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.lora = lora
        # A LoRA checkpoint holds the adapters only; the base comes from `model` at load time.
        self.strict_loading = lora is None
        self.updater = PolicyUpdate(algorithm, self.rollout_cfg, optim, max_nonfinite_steps, logprob_chunk_tokens,
                                    correction=rollout_correction.resolve(self.rollout_cfg))  # (auto: by the engine)
        self.save_hyperparameters()
        self.automatic_optimization = False

        self.policy: Optional[torch.nn.Module] = None
        self.ref_policy: Optional[torch.nn.Module] = None
        self.tokenizer = None
        self.engine: Optional[RolloutEngine] = None
        self.ciw_scorer: Optional[CIWScorer] = None
        self._plan: Optional[FSDP2Plan] = None  # FSDP2 sharding of the policy (None: replicated)
        self.rollout_step = 0  # rollout batches done; saved in checkpoints (seeds depend on it)
        dynamic = algorithm.dynamic_sampling
        # DAPO's dynamic sampling: the informative groups of the rounds before an update.
        self.group_filter = InformativeGroups(dynamic.max_rounds) if dynamic.enabled else None
        self._reward_counts = {"timeout": 0, "error": 0, "none": 0}  # unscorable, by cause, before a resume
        self._pending_rng_state: Optional[dict] = None  # restored before the first step after a resume
        self._step_stats = StepStats()  # token counts and seconds of the last step (compute accounting)
        self.settings_checked = False  # `check_fit_settings` done (by the command line, or in `setup`)
        self._in_flight: Optional[Produced] = None  # max_staleness 1: the next step's batch, generated ahead

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
        if self.lora is not None:
            self.policy = apply_lora(self.policy, self.lora)
        self.policy.train()  # from_pretrained returns eval mode; dropout is off either way (load_policy)
        if self.gradient_checkpointing:
            enable_activation_checkpointing(self.policy, {"use_reentrant": False})
        if self.torch_compile:  # after sharding and checkpointing: both stay outside the compiled layers
            compile_decoder_layers(self.policy)
        if self.algorithm.needs_reference and self.lora is None:  # a KL in the loss or in the reward
            # (With LoRA the reference is the base, adapters off: `PolicyUpdate.ref_logprobs`.)
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
            return load_sharded_policy(self.model_name, self._plan, dtype=self.dtype_name, seed=self.rollout_cfg.seed,
                                       attn_implementation=self.attn_implementation)
        return load_policy(self.model_name, dtype=self.dtype_name, seed=self.rollout_cfg.seed,
                           attn_implementation=self.attn_implementation)

    @property
    def sync(self) -> RankSync:
        """Collectives over the run's processes (a no-op in one process)."""
        return RankSync.from_trainer(self._trainer)

    @property
    def model_scored_rewards(self) -> tuple[str, ...]:
        """The rewards a model scores in the trainer's process (``reward_model:``, ``judge:``), by
        name (config_checks reads them here: it may not import ``rewards/``)."""
        return tuple(spec.name for spec in self.reward_specs if model_scored_kind(spec.name))

    @property
    def context_limit(self) -> Optional[int]:
        """Longest prompt + response the policy and the rollout engine take (None: unknown)."""
        positions = getattr(getattr(self.policy, "config", None), "max_position_embeddings", None)
        engine = self.engine.context_limit if self.engine is not None else None
        limits = [x for x in (positions, engine) if isinstance(x, int)]
        return min(limits) if limits else None

    @property
    def step_stats(self) -> StepStats:
        """The last step's compute: its tokens by kind of pass and its seconds (read by
        ``callbacks.ComputeBudgetStopper``; one object for the whole fit, reset at each step)."""
        return self._step_stats

    @property
    def weights_version(self) -> int:
        """Optimizer steps taken (skipped ones excluded): which weights a rollout engine holds."""
        return self.updater.weights_version

    def _build_engine(self) -> RolloutEngine:
        cfg = self.rollout_cfg
        # max_staleness 1: the engine's waits run in the producer thread, beside the update's
        # collectives: over a process group of their own (`producer_sync`, made here on every rank)
        world = self._trainer.world_size if self._trainer is not None else 1
        engine_sync = producer_sync(world) if cfg.max_staleness else None
        engine = build_engine(
            self.policy, self.tokenizer, cfg.sampling, cfg.backend, vllm=cfg.vllm, dtype=self.dtype_name,
            model_path=model_files(self.model_name),
            reshard_after_forward=self._plan.reshard_after_forward if self._plan is not None else True,
            stop_strings=cfg.tools is not None, sync=engine_sync, hf_decode=cfg.hf_decode,
        )
        return with_tools(engine, self.tokenizer, cfg.tools, (engine_sync or self.sync).any)

    def setup(self, stage: str) -> None:
        # The cross-section checks (`ibpo_lit.config_checks`) for `Trainer.fit(module)` in Python,
        # before `configure_model` loads any weights. The command line has run them already,
        # earlier still (before the data module loads its tokenizer, with --ckpt_path known).
        if stage == "fit" and not self.settings_checked:
            check_fit_settings(self, self.trainer.datamodule, self.trainer)
            self.settings_checked = True

    def on_fit_start(self) -> None:
        # After the strategy's precision plugin cast the module (bf16-true casts buffers too).
        fp32_rotary_buffers(self.policy)
        # The update's models and what it needs from this fit's trainer, all known from here on
        # (the strategy has placed the module); the same for every step of the fit.
        self.updater.bind(self.policy, self.ref_policy, UpdateRuntime(
            self.sync, self.trainer.world_size, self.device, self.manual_backward, self.step_stats))

    def configure_optimizers(self):
        return build_optimizer(self.policy, self.optim_cfg, self.trainer.max_steps)

    # ------------------------------------------------------------ one step
    def training_step(self, prompts: list[Prompt] | StepPrompts, batch_idx: int) -> None:
        self._restore_rng_once()
        clock = StepClock()
        self.step_stats.reset()  # every forward of the step counts
        if self.rollout_cfg.max_staleness:  # the next step's rollouts generated during this update
            return self._off_policy_step(prompts, clock)

        # 1-2. rollouts, scored (a NaN reward is unscorable)
        rollouts, texts = self._generate(prompts)
        tools = tool_metrics(self.engine)  # (empty without rollout.tools)
        clock.mark("generate")
        rewards = self.score(texts, [prompts[g] for g in rollouts.group_index.tolist()])
        self.unscorable_streak.check(rewards, self.sync, self._reward_failure())  # raises at the cap
        reward_metrics = self._reward_metrics()  # each reward's mean, of these rollouts
        step = ScoredRollouts(prompts=prompts, rollouts=rollouts, texts=texts, rewards=rewards, step=self.rollout_step)

        # 3. callbacks that act between scoring and the loss (corrections)
        self._call_step_hooks("on_rollouts_scored", step)
        clock.mark("correct")

        # 4. shaping and advantages (dynamic sampling: keep informative groups, else refill from
        #    the next batch), CIW's token weights; then callbacks that read the finished step
        scored = step
        step, metrics = self._informative_groups(step, self._assemble(step))
        if step is None:  # too few informative groups so far: the next batch refills
            return self._end_round(scored, clock)
        metrics.update(self._ciw_weights(step))
        self._call_step_hooks("on_before_update", step)
        clock.mark("callbacks")

        # 5. updates (a vLLM engine in sleep mode has freed its memory: see VLLMWeightSync)
        metrics.update(self.updater.run(step.update, self.optimizers(), self.lr_schedulers(), self.rollout_step))
        clock.mark("update")

        metrics.update(self._end_round(scored, clock))
        self._log_metrics({**metrics, **reward_metrics, **tools, **self._run_counts()})

    def _off_policy_step(self, prompts: StepPrompts, clock: StepClock) -> None:
        """One step off-policy (``training.off_policy``): train on the batch generated during the
        last step's update (or now, at a fit's first step), while a thread generates the next's."""
        # 1-3. this step's rollouts, scored and corrected: in flight since the last step, or sampled now
        produced = self._take_in_flight(prompts.now) or self._produce(prompts.now, self.rollout_step)
        self._in_flight = None
        clock.mark("rollouts")
        self.unscorable_streak.check(produced.scored.rewards, self.sync, produced.failure)  # raises at the cap
        next_step = self.rollout_step + 1  # read now: the main thread moves rollout_step on
        ahead = AheadOfUpdate(lambda: self._produce(prompts.ahead, next_step))  # the engine holds these weights
        try:
            scored = produced.scored
            lag = staleness(self.weights_version, scored.weights_version, self.rollout_cfg.num_mini_batches)
            check_ranks_agree(self.sync.gather(lag), scored.step)  # (the default group: the main thread's)
            check_staleness(lag, self.rollout_cfg.max_staleness, scored.step)
            # 4-5. as on-policy (no dynamic sampling here: config_checks)
            step, metrics = scored, self._assemble(scored)
            metrics.update(self._ciw_weights(step))
            self._call_step_hooks("on_before_update", step)
            clock.mark("callbacks")
            metrics.update(self.updater.run(step.update, self.optimizers(), self.lr_schedulers(), self.rollout_step))
            clock.mark("update")
        except BaseException:  # this error, not the producer's: but never leave it using the engine
            ahead.wait()
            raise
        # The weight sync after this step, and its checkpoint, need the engine idle and the batch done.
        self._in_flight = ahead.join()
        clock.mark("ahead_wait")
        metrics.update(self._end_round(scored, clock))
        metrics.update(overlap_metrics(clock, self._in_flight, lag))
        self._log_metrics({**metrics, **produced.reward_metrics, **produced.tool_metrics, **self._run_counts()})

    def _produce(self, prompts: list[Prompt], rollout_step: int) -> Produced:
        """Generate, score and correct one step's rollouts (in the producer thread, or on the main
        thread at a fit's first step); its collectives (the engine's) run over the engine's own
        group (`producer_sync`), never the update's."""
        started = time.perf_counter()
        held = getattr(unwrap(self.engine), "weights_version", None)  # the engine's own record
        version = self.weights_version if held is None else held
        rollouts, texts = self._generate(prompts, rollout_step)
        tools = tool_metrics(self.engine)
        generated = time.perf_counter()
        rewards = self.score(texts, [prompts[g] for g in rollouts.group_index.tolist()])
        failure, reward_metrics = self._reward_failure(), self._reward_metrics()
        step = ScoredRollouts(prompts=prompts, rollouts=rollouts, texts=texts, rewards=rewards, step=rollout_step,
                              weights_version=version)
        self._call_step_hooks("on_rollouts_scored", step)
        finished = time.perf_counter()
        return Produced(step, reward_metrics, tools, list(failure) if failure is not None else None,
                        {"generate": generated - started, "correct": finished - generated}, started, finished)

    def _take_in_flight(self, prompts: list[Prompt]) -> Optional[Produced]:
        """The batch generated ahead for this step (None at a fit's first step without one);
        checked to be this step's and these prompts'."""
        produced = self._in_flight
        if produced is None:
            return None
        scored = produced.scored
        if scored.step != self.rollout_step or [p.uid for p in scored.prompts] != [p.uid for p in prompts]:
            raise RuntimeError(
                f"the batch in flight is rollout step {scored.step}'s of prompts {[p.uid for p in scored.prompts]}, "
                f"but this is step {self.rollout_step} with prompts {[p.uid for p in prompts]}: the data module's "
                "position and the checkpoint's batch in flight disagree")
        return produced

    def _end_round(self, scored: ScoredRollouts, clock: StepClock) -> dict[str, float]:
        """A generation round ends: its compute (``step_stats``, what the budget charges) and
        timings; the next round samples with the next seeds."""
        self.rollout_step += 1
        return step_metrics(scored, clock, self.step_stats)

    def _assemble(self, step: ScoredRollouts) -> dict[str, float]:
        # REINFORCE++ puts the KL into the reward: the reference's log-probs before the advantages.
        reference = self._reference_logprobs if self.algorithm.kl_in_reward else None
        return assemble_update(step, self.algorithm, self.tokenizer.pad_token_id, self.rollout_cfg.sampling.max_new_tokens,
                               reference, self.sync)

    def _reference_logprobs(self, batch) -> Tensor:
        return self.updater.reference_logprobs(batch.to(self.device))

    def _informative_groups(self, step: ScoredRollouts, metrics: dict[str, float]):
        """Dynamic sampling (``algorithm.dynamic_sampling``): ``(None, metrics)`` while the
        rounds so far hold too few informative groups (the next batch refills), then the step
        of the informative groups to update on with the rounds' metrics. Off: ``step`` as it is."""
        if self.group_filter is None:
            return step, metrics
        step = self.group_filter.add(step, metrics, self.sync, self.global_rank,
                                     pad_token_id=self.tokenizer.pad_token_id)
        if step is None:
            return None, metrics
        self._assemble(step)  # the joined groups' shaping and advantages (per group: unchanged)
        return step, self.group_filter.metrics()

    def _generate(self, prompts: list[Prompt], rollout_step: Optional[int] = None):
        """``G`` responses per prompt from the engine, and their text (seeded by ``rollout_step``,
        unset: this step's)."""
        G = self.rollout_cfg.group_size
        step = self.rollout_step if rollout_step is None else rollout_step
        seeds = rollout_seeds(self.rollout_cfg.seed, step, MAIN_ROLLOUTS, len(prompts) * G, rank=self.global_rank)
        rollouts = self.engine.generate([p.prompt_ids for p in prompts], n=G, seeds=seeds)
        return rollouts, self.tokenizer.batch_decode(rollouts.response_lists(), skip_special_tokens=True)

    def _restore_rng_once(self) -> None:
        """Resumed: every global RNG continues where the checkpoint left it. Here rather than at
        load time: Lightning draws from torch's generator in between (a new DataLoader
        iterator), where an uninterrupted run does not."""
        if self._pending_rng_state is not None:
            restore_rng_state(self._pending_rng_state)
            self._pending_rng_state = None

    def validation_step(self, prompts: list[Prompt], batch_idx: int, dataloader_idx: int = 0) -> None:
        """avg@k on held-out prompts (``val/accuracy``, the training reward) or on an evaluation
        benchmark (``data.val_benchmarks``: ``val/<name>/avg@k`` and ``pass@k``, scored by the
        benchmark's verifier). The same seeds at every validation, so two checkpoints differ
        only by their weights."""
        k = self.val_samples
        val_set = prompts[0].meta.get(VAL_SET_KEY) if prompts else None
        step, stream = (batch_idx, VALIDATION) if val_set is None else (batch_idx + 10_000 * dataloader_idx,
                                                                          BENCHMARK_VALIDATION)
        seeds = rollout_seeds(self.rollout_cfg.seed, step, stream, len(prompts) * k, rank=self.global_rank)
        rollouts = self.engine.generate([p.prompt_ids for p in prompts], n=k, seeds=seeds)
        texts = self.tokenizer.batch_decode(rollouts.response_lists(), skip_special_tokens=True)
        rows = [prompts[g] for g in rollouts.group_index.tolist()]
        if val_set is not None:
            self._log_benchmark(val_set, texts, rows, k)
            return
        rewards = self.score(texts, rows)
        scored = rewards.nan_to_num(0.0)  # an unscorable response counts as wrong here
        n = len(rewards)
        self.log("val/accuracy", scored.mean(), on_epoch=True, batch_size=n, prog_bar=True, sync_dist=True,
                 add_dataloader_idx=False)
        self.log("val/response_len", rollouts.response_lengths.float().mean(), on_epoch=True, batch_size=n,
                 sync_dist=True, add_dataloader_idx=False)

    def _log_benchmark(self, name: str, texts: list[str], rows: list[Prompt], k: int) -> None:
        """``val/<name>/avg@k`` and ``val/<name>/pass@k`` (with k samples, pass@k is whether any
        is correct), by the benchmark's own verifier, whatever the training reward."""
        verifier = get_task(rows[0].task).reward
        if verifier not in self._val_pools:
            self._val_pools[verifier] = scoring_pool(verifier, self.reward_workers, self.reward_timeout_s)
        values = self._val_pools[verifier].score([(text, p.gold) for text, p in zip(texts, rows)])
        correct = torch.tensor([v is not None and v > 0.5 for v in values]).view(-1, k)  # unscorable: wrong
        # `evaluate`'s own metrics (k samples of each problem: pass@k is whether any is right)
        self.log(f"val/{name}/avg@{k}", avg_at_k(correct), on_epoch=True, batch_size=correct.numel(),
                 sync_dist=True, add_dataloader_idx=False)
        self.log(f"val/{name}/pass@{k}", mean_pass_at_k(correct.sum(dim=1), k, k), on_epoch=True,
                 batch_size=len(correct), sync_dist=True, add_dataloader_idx=False)

    def score(self, texts: list[str], prompts: list[Prompt]) -> Tensor:
        """Rewards (the weighted sum of ``model.rewards``), [len(texts)] float on the CPU; NaN
        where a text cannot be scored (timed out, raised, returned None or a bad value). A
        reward function gets each prompt's problem text and its record's fields as columns."""
        if self._reward_pool is None:
            self._reward_pool = WeightedRewards(self.reward_specs, self._reward_scoring_pool)
        values = self._reward_pool.score([(text, prompt.gold) for text, prompt in zip(texts, prompts)],
                                         [prompt.problem for prompt in prompts],
                                         [getattr(prompt, "columns", None) or {} for prompt in prompts])
        return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)

    def _reward_scoring_pool(self, name: str):
        """The pool a reward of ``model.rewards`` is scored in: a model scoring in this process,
        handed what it needs from the run (`ModelRewardContext`: device, collectives, FSDP2
        plan, and the engine's generate and tokenizer for a judge that is the policy), or its
        task's pool (`scoring_pool`)."""
        if model_scored_kind(name) is None:
            return scoring_pool(name, self.reward_workers, self.reward_timeout_s, batch_size=self.reward_batch_size)
        spec = next(s for s in self.reward_specs if s.name == name)
        engine = unwrap(self.engine) if self.engine is not None else None  # a judge's reply runs no cells
        return model_reward_pool(spec, ModelRewardContext(
            device=self.device, sync=self.sync, plan=self._plan, dtype=self.dtype_name,
            batch_size=self.reward_batch_size, tokenizer=self.tokenizer,
            generate=engine.generate if engine is not None else None, context_limit=self.context_limit,
            seed=self.rollout_cfg.seed, weights_version=lambda: self.weights_version))

    def _reward_failure(self) -> Optional[tuple[str, Optional[str]]]:
        """``(reward, its last error)`` of the last `score` call's unscorable responses, or None."""
        return self._reward_pool.last_failure if self._reward_pool is not None else None

    def _reward_metrics(self) -> dict[str, float]:
        """``reward/<name>``: each reward's mean over the responses it could score (NaN: none),
        of the last `score` call; ``reward/<name>_penalized``: the fraction a judge or reward
        model gave its minimum because they broke it (docs/reward_models.md)."""
        parts = self._reward_pool.last_parts if self._reward_pool is not None else {}
        penalized = self._reward_pool.last_penalized if self._reward_pool is not None else {}
        out = {}
        for label, values in parts.items():
            scored = [v for v in values if v is not None]
            out[f"reward/{label}"] = sum(scored) / len(scored) if scored else math.nan
            if label in penalized:
                out[f"reward/{label}_penalized"] = penalized[label] / len(values) if values else math.nan
        return out

    def teardown(self, stage: str) -> None:
        if self._reward_pool is not None:
            self._reward_pool.close()
            self._reward_pool = None
        for pool in self._val_pools.values():
            pool.close()
        self._val_pools = {}
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

    def correction_context(self) -> CorrectionContext:
        """What IBPO's correction rollouts need from the run (``training.corrections``)."""
        return CorrectionContext(
            tokenizer=self.tokenizer, generate=self.engine.generate, score=self.score, seed=self.rollout_cfg.seed,
            rank=self.global_rank, sampling=self.rollout_cfg.sampling, context_limit=self.context_limit,
        )

    def weight_sync_context(self) -> WeightSyncContext:
        """What keeping a separate rollout engine on the policy's weights needs from the run, as
        it is now (``callbacks.VLLMWeightSync``)."""
        return WeightSyncContext(
            engine=unwrap(self.engine), policy=self.policy, tokenizer=self.tokenizer,
            weights_version=self.weights_version,
            num_mini_batches=self.rollout_cfg.num_mini_batches, device=self.device, sync=self.sync,
            forward_context=self._trainer.precision_plugin.forward_context if self._trainer is not None else nullcontext,
        )

    def _ciw_weights(self, step: ScoredRollouts) -> dict[str, float]:
        """CIW: pi_old's counterfactual drops weight the tokens of every row that gets a gradient
        (a zero-advantage row gets none, whatever its weights); multiplies into ``step.update``."""
        update = step.update
        if self.ciw_scorer is None:
            return {"train/zero_adv_frac": float((~rows_with_advantage(update.advantages)).float().mean())}
        ciw = self.ciw_scorer(
            self.policy, update.batch.to(self.device), rows=rows_with_advantage(update.advantages), step=self.rollout_step,
            temperature=self.rollout_cfg.sampling.temperature,
            sync=self.sync if self.updater.uniform_forwards else None, packed=self.updater.packed,
        )
        update.token_weights = ciw.weights if update.token_weights is None else update.token_weights * ciw.weights
        self.step_stats.no_grad_tokens += int(ciw.metrics.get("ciw/forward_tokens", 0))
        return {**ciw.metrics, "train/zero_adv_frac": float((~rows_with_advantage(update.advantages)).float().mean())}

    # ----------------------------------------------------------- logging/ckpt
    def _reward_totals(self) -> dict[str, int]:
        """Unscorable responses of the whole run by cause (a resumed run adds its checkpoint's)."""
        live = self._reward_pool.unscorable if self._reward_pool is not None else {}
        return {k: v + live.get(k, 0) for k, v in self._reward_counts.items()}

    def _run_counts(self) -> dict[str, float]:
        """The run's counters so far: unscorable responses by cause, skipped steps, and the
        DataModule's (bad records skipped, long prompts skipped or truncated)."""
        counts = self._reward_totals()
        out = {"train/reward_timeouts": float(counts["timeout"]), "train/reward_errors": float(counts["error"]),
               "train/reward_none": float(counts["none"]),
               "train/nonfinite_steps": float(self.updater.nonfinite_total)}  # a count, not a mean
        stats = getattr(getattr(self.trainer, "datamodule", None), "stats", None)
        if not isinstance(stats, dict):
            return out
        out.update({f"data/{k}": float(v) for k, v in stats.items()})
        out["data/skipped"] = float(stats.get("skipped_records", 0) + stats.get("skipped_long_prompts", 0))
        return out

    def _log_metrics(self, metrics: dict[str, float]) -> None:
        """Log a step's metrics, each combined over ranks as `ibpo_lit.training.metric_reductions`
        declares (counts summed, durations and extremes maximised, rates averaged)."""
        metrics = self.sync.reduce_metrics(metrics, reduction_of)
        if self.group_filter is not None:
            # Several batches (generation rounds) make one update: TensorBoard's step is the
            # update's index, as without dynamic sampling (Lightning's own counts batches).
            self.log("step", float(self.trainer.global_step // self.rollout_cfg.num_mini_batches - 1), on_step=True,
                     batch_size=1)
        bar = {"train/reward", "train/correction_success", "train/unscorable", "train/nonfinite_steps", "data/skipped"}
        for key, value in metrics.items():
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            self.log(key, float(value), on_step=True, prog_bar=key in bar, batch_size=1)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.lora is not None:  # the frozen base is `model` itself: keep the adapters only
            keep = {f"policy.{name}" for name in adapter_state(self.policy)}
            state = checkpoint["state_dict"]
            for key in [k for k in state if k.startswith("policy.") and k not in keep]:
                del state[key]
        checkpoint["ibpo_lit"] = {
            "rollout_step": self.rollout_step,
            "update": self.updater.state_dict(),  # the weights' version, the non-finite counts
            "reward_counts": self._reward_totals(),
            "unscorable_streak": self.unscorable_streak.state_dict(),  # the same on every rank
            # The command line resumes logging into the same TensorBoard version (`run_state`).
            "logger_version": self.logger.version if self.logger is not None else None,
            # Every rank's generators (a collective: Lightning calls this hook on every rank).
            "rng_per_rank": self.sync.gather(capture_rng_state()),
            "seeds": dict(self.seeds),  # `fit --ckpt_path` resumes with this seed_everything (cli.py)
        }
        if self.group_filter is not None:  # rounds in progress (between two updates), each rank's
            checkpoint["ibpo_lit"]["dynamic_sampling_per_rank"] = self.sync.gather(self.group_filter.state_dict())
        if self.rollout_cfg.max_staleness:  # its weights are gone, so it is saved, not regenerated; every rank's
            per_rank = self.sync.gather(in_flight_state(self._in_flight) if self._in_flight is not None else None)
            if any(state is not None for state in per_rank):
                checkpoint["ibpo_lit"]["in_flight_per_rank"] = per_rank

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.lora is not None and not any(".lora_" in key for key in checkpoint.get("state_dict", {})):
            raise ValueError("model.lora is set but the checkpoint holds no LoRA adapter weights: it was trained "
                             "without model.lora (resume it without model.lora)")
        state = checkpoint.get("ibpo_lit", {})
        if self._trainer is None or self.trainer.state.fn == "fit":  # a resumed fit samples on with them
            check_resumed_seeds(state.get("seeds"), self.seeds, "policy")
        self.rollout_step = state.get("rollout_step", 0)
        self.updater.load_state_dict(state.get("update", _flat_update_state(state)))
        self._reward_counts.update(state.get("reward_counts", {}))
        self.unscorable_streak.load_state_dict(state.get("unscorable_streak", {}))
        self._pending_rng_state = self._own_rng_state(state)
        in_flight = self._own_in_flight(state)
        keep = in_flight is not None and self.rollout_cfg.max_staleness
        self._in_flight = in_flight_from_state(in_flight) if keep else None
        if in_flight is not None and self._in_flight is None:
            rank_zero_warn("the checkpoint holds a batch generated one step ahead (model.rollout.max_staleness: 1) and "
                           "this run is on-policy: the batch is dropped and its step samples again")
        rounds = state.get("dynamic_sampling_per_rank")
        if self.group_filter is not None and rounds is not None:
            world = self._trainer.world_size if self._trainer is not None else 1
            if len(rounds) == world:
                self.group_filter.load_state_dict(rounds[self.global_rank])
            else:
                rank_zero_warn(f"the checkpoint's dynamic-sampling rounds in progress belong to {len(rounds)} "
                               f"processes and this run has {world}: they are dropped (generated again).")
        self.configure_model()

    def _own_in_flight(self, state: dict) -> Optional[dict]:
        """This rank's saved batch in flight (max_staleness 1); none when the run's size changed
        (each rank's prompts are its own: the step samples again)."""
        per_rank = state.get("in_flight_per_rank")
        if per_rank is None:  # a checkpoint from before per-rank batches: one process's
            return state.get("in_flight") if self.global_rank == 0 else None
        world = self._trainer.world_size if self._trainer is not None else 1
        if len(per_rank) != world:
            rank_zero_warn(f"the checkpoint holds the batches in flight of {len(per_rank)} processes and this run has "
                           f"{world}: they are dropped and the step samples again")
            return None
        return per_rank[self.global_rank]

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


def _flat_update_state(state: dict) -> dict:
    """`PolicyUpdate`'s counters in a checkpoint written before they had an entry of their own
    (``update``): then they sat beside ``rollout_step``, under the same names."""
    return {key: state[key] for key in ("weights_version", "nonfinite_run", "nonfinite_total") if key in state}
