"""The plan's constants that only a GPU can measure, each with its value and its source.

Every number the plan's memory arithmetic takes from outside the model's shape and the run's
config lives here, once, with what it stands for and who measured it. ``measured`` names the
device, the date and the file of a GPU measurement; ``None`` means no GPU has measured it yet:
``python -m ibpo_lit plan`` lists those under its verdict and docs/scaling.md keeps the same
list. `scripts/gpu_check.py` measures what a single GPU can (the CUDA context, the allocator's
slack, the update's activations and optimizer step) and fits the calibration in
`ibpo_lit.plan.calibration`; a session that has run it writes the fitted values here, with the
result file in ``measured``.

What a single GPU cannot measure (vLLM's own numbers: no vLLM wheel travels to the GPU machine
here; NCCL buffers of many GPUs) stays unmeasured until a run on such hardware.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class GpuConstant:
    value: float
    unit: str
    what: str
    measured: Optional[str] = None  # "device, date, file" of a GPU measurement; None: none yet


H100_MEMORY_GIB = GpuConstant(
    79.2, "GiB",
    "the memory an H100 80 GB reports to torch (`total_memory`; nvidia-smi shows 81559 MiB including the "
    "driver's reserve): the plan's GPU when no GPU is visible and `plan.gpu_memory_gib` is unset",
    measured=None)
"""The figure is review item 10's (issue 42), not a measurement of ours; the lent H100 reported
81559 MiB to nvidia-smi (KINDS.md of the device tool, 2026-11-13)."""

OVERHEAD_GIB = GpuConstant(
    3.0, "GiB", "outside any tensor, per GPU and phase: the CUDA context, NCCL buffers, the caching "
    "allocator's slack (reserved minus allocated); `plan.overhead_gib` overrides it")

ACTIVATION_FACTOR = GpuConstant(
    1.0, "x", "the update's backward transients (activations, the log-prob head's chunk, the gathered "
    "FSDP2 units, autocast copies) against their formulas; the activations' formula is measured within 15% "
    "on the CPU (tests/plan/test_plan_measured.py), the rest and any GPU kernel's workspace are not")

LOGIT_BYTES = GpuConstant(
    10, "bytes a logit", "the log-prob head's chunk: a bf16 logit, its float32 log-softmax and float32 "
    "gradient, for each of a chunk's positions and the vocabulary")

VLLM_BASE_RESERVE_GIB = GpuConstant(
    1.0, "GiB", "vLLM's working memory inside its share besides the profiled batch: CUDA graphs, the "
    "sampler's and the scheduler's buffers")

VLLM_SAMPLER_COPIES = GpuConstant(
    3, "copies", "float32 logits of `max_num_seqs` rows the sampler holds at once in vLLM's profile run "
    "(the logits, their probabilities, a sorted copy for top-p/top-k)")

VLLM_ASLEEP_GIB = GpuConstant(
    1.5, "GiB", "what a sleeping vLLM engine keeps on each GPU (its CUDA-graph pool, NCCL buffers): "
    "counted in the update and the weight sync when the engine sleeps (review item 10: 1-2 GiB)")

WEIGHT_SYNC_GB_PER_S = GpuConstant(
    10.0, "GB/s", "the rate at which one engine-dtype copy of the full weights reaches a running engine: "
    "FSDP2's gather and cast, the transfer (colocated: in place; a separate engine: an NCCL broadcast), vLLM's "
    "load_weights. verl and OpenRLHF report seconds to tens of seconds for 7B-70B models: a round figure "
    "inside that range, not a measurement")

GPU_CONSTANTS: dict[str, GpuConstant] = {
    "H100 memory": H100_MEMORY_GIB,
    "overhead": OVERHEAD_GIB,
    "activation factor": ACTIVATION_FACTOR,
    "log-prob head bytes": LOGIT_BYTES,
    "vLLM base reserve": VLLM_BASE_RESERVE_GIB,
    "vLLM sampler copies": VLLM_SAMPLER_COPIES,
    "vLLM asleep": VLLM_ASLEEP_GIB,
    "weight sync rate": WEIGHT_SYNC_GB_PER_S,
}


def unmeasured() -> list[str]:
    """``"name value unit"`` of every constant no GPU has measured, for the plan's output."""
    return [f"{name} {c.value:g} {c.unit}" for name, c in GPU_CONSTANTS.items() if c.measured is None]
