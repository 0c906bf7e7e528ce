"""Memory per GPU in each phase of a step, in bytes: pure arithmetic on `ModelShape` and `RunShape`.

A step's phases, and what lives on one GPU in each (``docs/scaling.md`` explains the choices):

* **rollout** (and **corrections**, the same engine with longer prompts): the trainer's residue
  (its parameter and optimizer shards: gradients are freed after each step) and the vLLM
  engine, which takes ``gpu_memory_utilization`` of the GPU for its weights (``1/tp`` of the
  model in the engine's dtype), a working reserve, and the KV cache in the rest. The HF engine
  instead gathers the whole model (FSDP2) and keeps every sequence's cache at once.
* **weight sync**: the residue, the engine's weights (awake without its KV cache), and the
  largest tensor gathered in full and cast (the sync streams one tensor at a time).
* **update**: sharded parameters, gradients and AdamW's two moments; the decoder layers
  FSDP2 gathers (the current one, the prefetched next, the current one's full gradient before
  its reduce-scatter) or an untied LM head with its gradient, whichever is larger; the
  activations autograd keeps for the longest micro-batch (`ModelShape.activation_bytes`); the
  log-prob head's chunk of logits (its value, float32 log-softmax and gradient: 10 bytes a
  logit); a vLLM engine that does not sleep keeps its share.

Every phase adds ``overhead_gib`` (CUDA context, NCCL buffers, the allocator's fragmentation).
"""
from __future__ import annotations

from typing import Optional

from ibpo_lit.plan.run import RunShape
from ibpo_lit.plan.shapes import ModelShape

GIB = 1024 ** 3
VLLM_RESERVE_GIB = 2.0
"""vLLM's own working memory inside its share (the profiled forward's activations, CUDA
graphs, sampler): what is left after the weights and this is the KV cache."""
LOGIT_BYTES = 10  # bf16 logit + float32 log-softmax + float32 gradient, per chunk position
ADAMW_STATES = 2


def trainer_state(model: ModelShape, run: RunShape, with_grads: bool) -> dict[str, float]:
    """The trainer's persistent tensors on one GPU (FSDP2: its shard; otherwise a full copy)."""
    share = model.params * run.param_bytes / run.shard_degree
    parts = {"parameters": share, "optimizer (AdamW)": ADAMW_STATES * share}
    if with_grads:
        parts["gradients"] = share
        if not run.sharded and run.processes > 1:
            parts["DDP gradient buckets"] = share
    if not run.sharded and run.compute_bytes < run.param_bytes:
        parts["bf16 weight copies (autocast)"] = model.params * run.compute_bytes
    return parts


def engine_share(run: RunShape, device_bytes: float) -> float:
    return run.gpu_memory_utilization * device_bytes


def engine_weights(model: ModelShape, run: RunShape) -> float:
    return model.params * run.engine_bytes / run.tensor_parallel


def kv_capacity_tokens(model: ModelShape, run: RunShape, device_bytes: float) -> float:
    """Tokens the engine's KV cache holds on one GPU (its share, less weights and reserve)."""
    free = engine_share(run, device_bytes) - engine_weights(model, run) - VLLM_RESERVE_GIB * GIB
    return max(0.0, free) / model.kv_bytes_per_token(run.tensor_parallel, run.engine_bytes)


def rollout_memory(model: ModelShape, run: RunShape, device_bytes: float, sequences: int,
                   sequence_tokens: int) -> dict[str, float]:
    """One GPU while the engine generates ``sequences`` of up to ``sequence_tokens`` tokens."""
    parts = trainer_state(model, run, with_grads=False)
    if run.backend == "vllm":
        parts["vLLM engine (weights, reserve, KV cache)"] = engine_share(run, device_bytes)
        return parts
    # HF engine: the whole model gathered for decoding, every sequence's cache at once, and
    # the float32 logits of one decoding step
    if run.sharded or run.compute_bytes < run.param_bytes:
        parts["gathered weights"] = model.params * run.compute_bytes
    parts["KV cache"] = sequences * sequence_tokens * model.kv_bytes_per_token(1, run.compute_bytes)
    parts["KV cache"] += sequences * model.state_bytes_per_sequence(1, run.compute_bytes)
    parts["logits"] = sequences * model.vocab * 4
    return parts


def sync_memory(model: ModelShape, run: RunShape) -> dict[str, float]:
    """One GPU during the weight sync (vLLM only)."""
    parts = trainer_state(model, run, with_grads=False)
    parts["engine weights"] = engine_weights(model, run)
    parts["one tensor gathered and cast"] = model.largest_tensor * (run.param_bytes + run.engine_bytes)
    return parts


def gathered_units(model: ModelShape, run: RunShape) -> float:
    """FSDP2's unsharded parameters at the update's worst moment (see the module docstring)."""
    if not run.sharded:
        return 0.0
    layer = model.layer_params * (2 * run.compute_bytes + 4)
    if model.head_params:  # untied: the head is its own unit, gathered with its full gradient
        return max(layer, model.head_params * (run.compute_bytes + 4))
    # tied: embeddings and head are one unit in the root, gathered from forward to backward
    return model.embed_params * run.compute_bytes + max(layer, model.embed_params * 4)


def update_memory(model: ModelShape, run: RunShape, device_bytes: float, longest_row: int) -> dict[str, float]:
    """One GPU in the update, for micro-batches of ``micro_batch_size`` rows of ``longest_row``."""
    parts = trainer_state(model, run, with_grads=True)
    parts["gathered units"] = gathered_units(model, run)
    tokens = run.micro_batch_size * longest_row
    parts["activations (longest micro-batch)"] = model.activation_bytes(tokens, run.compute_bytes, run.checkpointing)
    chunk = min(run.logprob_chunk_tokens or tokens, tokens)
    parts["log-prob head chunk"] = chunk * model.vocab * LOGIT_BYTES
    if run.backend == "vllm" and not run.sleep_mode and run.on_gpu:
        parts["vLLM engine (awake: no sleep mode)"] = engine_share(run, device_bytes)
    return parts


def total(parts: dict[str, float], overhead_bytes: float) -> float:
    return sum(parts.values()) + overhead_bytes


def longest_row(run: RunShape, context: Optional[int]) -> int:
    """The longest row the update trains: a rollout, or a correction (its prompt and answer fill
    up to the context limit) when corrections are trained."""
    rollout = run.max_prompt_tokens + run.max_new_tokens
    if run.corrections and run.train_on_corrections:
        limit = run.context_limit(context)
        correction = correction_prompt_tokens(run) + run.correction_new_tokens
        return max(rollout, min(correction, limit) if limit else correction)
    return rollout


CORRECTION_TEMPLATE_TOKENS = 160
"""The correction prompt's own words (instruction, labels, chat template) in tokens: the default
template is some 70 words of English, under 160 tokens in any of the shipped models' tokenizers."""


def correction_prompt_tokens(run: RunShape) -> int:
    """The longest correction prompt before any cut: the problem and whole candidates."""
    candidates = 2 if run.two_candidates else 1
    return run.max_prompt_tokens + CORRECTION_TEMPLATE_TOKENS + candidates * run.max_new_tokens
