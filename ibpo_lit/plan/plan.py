"""The plan of a run: memory per GPU by phase, the correction prompt's budget, FLOPs and seconds
per phase, the collective timeout they imply, and a verdict for each.

``python -m ibpo_lit plan --config C`` prints it (`ibpo_lit.plan.cli`); ``fit`` refuses a config
whose plan fails (`Plan.problems`, run by `ibpo_lit.config_checks`) unless ``plan.check: false``.
Memory arithmetic is in `ibpo_lit.plan.memory`; the model's sizes in `ibpo_lit.plan.shapes`.

Times are worst cases at stated rates (`PlanSettings`): every response runs to
``max_new_tokens`` and every rollout is wrong (so every one is corrected). Rollout time is the
engine's waves (how many of the sequences its KV cache holds at once) times one sequence's
decoding at ``decode_tokens_per_s``; prefill is not counted. The update's is its FLOPs (6 per
active parameter and trained token, 8 with gradient checkpointing; 2 per token of an extra
no-grad forward) at ``mfu`` of ``peak_tflops``. The weight sync's is one engine-dtype copy of the
weights at ``constants.WEIGHT_SYNC_GB_PER_S``. The timeout a run needs: the longest time a
rank can wait in one collective, a rank whose engine finished waiting for the slowest engine's
rollouts and corrections: 1.5 times those.

The asynchronous line (`Plan.async_step_s`): generation one step ahead of training (one-step
off-policy, the engine on GPUs of its own) costs the longer of generation and update plus the
sync, where today's synchronous step costs their sum.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from ibpo_lit.plan import constants, memory
from ibpo_lit.plan.memory import GIB
from ibpo_lit.plan.report import gib, render
from ibpo_lit.plan.run import RunShape
from ibpo_lit.plan.shapes import ModelShape

TIMEOUT_MARGIN = 1.5


@dataclass
class PlanSettings:
    """The hardware the plan is for and what ``fit`` accepts (the ``plan:`` section of a config).

    Args:
        gpu_memory_gib: Memory of one GPU; unset = the visible GPU's own, else 79.2 (what an H100 80 GB
            reports).
        peak_tflops: The GPU's dense bf16 peak; unset = the visible GPU's (H100/H200: 989), else 989.
        mfu: Share of that peak the update reaches (0.3 is typical of FSDP training of long rows).
        decode_tokens_per_s: Tokens per second one sequence decodes at in a full engine batch
            (a 32B model at TP4 on H100s: about 50-80).
        overhead_gib: Per GPU outside any tensor: CUDA context, NCCL buffers, the allocator's slack
            (not yet measured on a GPU: docs/scaling.md).
        min_candidate_fraction: The least share of a longest candidate (``max_new_tokens``) a
            correction prompt may keep; below it ``fit`` refuses (IBPO's comparison would see
            mostly omitted text).
        check: ``fit`` refuses a config whose plan fails (memory, KV cache, timeout, correction
            budget) before anything loads; false: it only warns.
    """

    gpu_memory_gib: Optional[float] = None
    peak_tflops: Optional[float] = None
    mfu: float = 0.3
    decode_tokens_per_s: float = 60.0
    overhead_gib: float = constants.OVERHEAD_GIB.value
    min_candidate_fraction: float = 0.4
    check: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.mfu <= 1:
            raise ValueError(f"plan.mfu must be in (0, 1], got {self.mfu}")
        if not 0 <= self.min_candidate_fraction <= 1:
            raise ValueError(f"plan.min_candidate_fraction must be in [0, 1], got {self.min_candidate_fraction}")
        for name in ("gpu_memory_gib", "peak_tflops", "decode_tokens_per_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"plan.{name} must be > 0, got {value}")


PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1}
DEFAULT_GPU_GIB, DEFAULT_PEAK = constants.H100_MEMORY_GIB.value, 989.4


def device_numbers(settings: PlanSettings) -> tuple[float, float, str]:
    """``(memory GiB, peak TFLOP/s, where they came from)``: the settings', else the visible GPU's."""
    name = None
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            name, gpu_gib = props.name, props.total_memory / GIB
    except Exception:  # no CUDA build, a driver problem: the stated defaults
        name = None
    memory_gib = settings.gpu_memory_gib or (gpu_gib if name else DEFAULT_GPU_GIB)
    peak = settings.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if name and k in name), DEFAULT_PEAK)
    source = f"{name}" if name else "plan settings / defaults"
    return memory_gib, peak, source


@dataclass
class Phase:
    name: str
    parts: dict[str, float]  # bytes
    total: float  # bytes, overhead included
    seconds: Optional[float] = None
    notes: list[str] = field(default_factory=list)
    fits: bool = True


@dataclass
class Plan:
    model: ModelShape
    run: RunShape
    settings: PlanSettings
    device_gib: float
    peak_tflops: float
    device_source: str
    phases: list[Phase]
    context: Optional[int]
    candidate_tokens: Optional[int]  # of each candidate the correction prompt keeps (None: no IBPO)
    candidate_fraction: Optional[float]
    step_flops: float
    needed_timeout_s: float

    def problems(self) -> list[str]:
        """What ``fit`` refuses, each naming the keys to change."""
        out = []
        if self.run.on_gpu:
            for phase in self.phases:
                if not phase.fits:
                    out.append(f"plan: the {phase.name} phase needs {phase.total / GIB:.1f} GiB of the GPU's "
                               f"{gib(self.device_gib)} GiB ({'; '.join([_largest(phase), *phase.notes])})")
            if self.run.processes > 1 and self.needed_timeout_s > self.run.timeout_s:
                out.append(
                    f"plan: a rank can wait {self.needed_timeout_s / TIMEOUT_MARGIN / 60:.0f} min in one collective "
                    f"while the slowest engine decodes, past trainer.strategy's timeout of {self.run.timeout_s / 60:.0f} "
                    f"min: set trainer.strategy.init_args.timeout to at least "
                    f"\"{_hms(self.needed_timeout_s)}\" (h:m:s)")
        if self.candidate_fraction is not None and self.candidate_fraction < self.settings.min_candidate_fraction:
            out.append(
                f"plan: a correction prompt keeps {max(self.candidate_tokens, 0)} tokens of each "
                f"{self.run.max_new_tokens}-token candidate ({self.candidate_fraction:.0%}, below "
                f"plan.min_candidate_fraction={self.settings.min_candidate_fraction}): raise "
                "model.rollout.vllm.max_model_len, or lower model.algorithm.ibpo.max_new_tokens or "
                "model.rollout.sampling.max_new_tokens")
        return out

    def seconds(self, *names: str) -> float:
        return sum(p.seconds or 0.0 for p in self.phases if p.name in names)

    @property
    def async_step_s(self) -> float:
        """One-step off-policy with the engine on GPUs of its own, as many as the trainer's:
        generation (rollouts and corrections) of step t+1 runs while step t's update does, then
        the weights move. On the same GPUs split between the two, the best split (each side's
        share in proportion to its work, both scaling linearly) costs generation + update, the
        synchronous step less its sync: the split buys memory (no sleeping engine), not time."""
        return max(self.seconds("rollout", "corrections"), self.seconds("update")) + self.seconds("weight sync")

    def render(self) -> str:
        return render(self)


def build_plan(model: ModelShape, run: RunShape, settings: PlanSettings) -> Plan:
    device_gib, peak, source = device_numbers(settings)
    device = device_gib * GIB
    overhead = settings.overhead_gib * GIB
    context = run.context_limit(model.context)
    rate = settings.decode_tokens_per_s
    phases = []

    rollout_len = run.max_prompt_tokens + run.max_new_tokens
    per_engine = run.prompts_per_rank * run.tensor_parallel * run.group_size
    phases.append(_generation_phase("rollout", model, run, device, overhead, per_engine, rollout_len,
                                    run.max_new_tokens, rate))
    if run.backend in ("vllm", "vllm_server"):
        parts = memory.sync_memory(model, run)
        phases.append(_phase("weight sync", parts, overhead, device))
        phases[-1].seconds = model.params * run.engine_bytes / (constants.WEIGHT_SYNC_GB_PER_S.value * 1e9)

    candidate_tokens = fraction = None
    if run.corrections:
        corrections = per_engine * run.corrections_per_input
        prompt = memory.correction_prompt_tokens(run)
        length = min(prompt + run.correction_new_tokens, context) if context else prompt + run.correction_new_tokens
        phases.append(_generation_phase("corrections", model, run, device, overhead, corrections, length,
                                        run.correction_new_tokens, rate))
        if context:
            room = context - run.correction_new_tokens - run.max_prompt_tokens - memory.CORRECTION_TEMPLATE_TOKENS
            candidate_tokens = min(run.max_new_tokens, room // (2 if run.two_candidates else 1))
            fraction = max(candidate_tokens, 0) / run.max_new_tokens

    longest = memory.longest_row(run, model.context)
    parts = memory.update_memory(model, run, device, longest)
    update = _phase("update", parts, overhead, device)
    rows = run.prompts_per_rank * run.group_size
    trained = rows * rollout_len
    if run.corrections and run.train_on_corrections:
        trained += rows * run.corrections_per_input * longest
    flops = trained * model.active_params * (8 if run.checkpointing else 6)
    if run.extra_old_logp_forward:
        flops += trained * model.active_params * 2
    update.seconds = flops / (peak * 1e12 * settings.mfu)
    phases.append(update)

    waits = sum(p.seconds or 0 for p in phases if p.name in ("rollout", "corrections"))
    return Plan(model=model, run=run, settings=settings, device_gib=device_gib, peak_tflops=peak,
                device_source=source, phases=phases, context=context, candidate_tokens=candidate_tokens,
                candidate_fraction=fraction, step_flops=flops, needed_timeout_s=TIMEOUT_MARGIN * waits)


def _phase(name: str, parts: dict[str, float], overhead: float, device: float) -> Phase:
    total = memory.total(parts, overhead)
    return Phase(name=name, parts=parts, total=total, fits=total <= device)


def _generation_phase(name: str, model: ModelShape, run: RunShape, device: float, overhead: float,
                      sequences: int, sequence_tokens: int, new_tokens: int, rate: float) -> Phase:
    """Memory, KV-cache waves and decode time of one engine generating ``sequences``."""
    per_rank = sequences if run.backend == "vllm" else sequences // run.tensor_parallel
    phase = _phase(name, memory.rollout_memory(model, run, device, per_rank, sequence_tokens), overhead, device)
    if run.backend == "vllm":
        capacity = memory.kv_capacity_tokens(model, run, device)
        per_sequence = sequence_tokens + model.state_bytes_per_sequence(run.tensor_parallel, run.engine_bytes) / \
            model.kv_bytes_per_token(run.tensor_parallel, run.engine_bytes)
        at_once = min(sequences, run.max_num_seqs, int(capacity // per_sequence))
        phase.notes.append(f"KV cache {capacity / 1e6:.2f}M tokens a GPU: {max(at_once, 0)} of {sequences} "
                           f"sequences of {sequence_tokens} tokens at once")
        if at_once < 1:
            phase.fits = False
            phase.notes.append("the KV cache cannot hold one sequence: raise model.rollout.vllm.gpu_memory_utilization "
                               "or tensor_parallel_size, or shorten max_model_len")
            return phase
        waves = math.ceil(sequences / at_once)
    else:
        waves = 1
        if run.backend == "vllm_server":
            phase.notes.append("on the vLLM server's own GPUs: its memory and KV cache are not planned here")
    phase.seconds = waves * new_tokens / rate
    phase.notes.append(f"{waves} wave{'s' if waves > 1 else ''} of {new_tokens} decoded tokens")
    return phase


def _largest(phase: Phase) -> str:
    name, value = max(phase.parts.items(), key=lambda kv: kv[1])
    return f"largest: {name} {value / GIB:.1f} GiB"


def _hms(seconds: float) -> str:
    seconds = int(math.ceil(seconds / 60.0) * 60)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:00"
