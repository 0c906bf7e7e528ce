"""Memory per GPU in each phase of a step, in bytes: pure arithmetic on `ModelShape` and `RunShape`.

A step's phases, and what lives on one GPU in each (``docs/scaling.md`` explains the choices):

* **rollout** (and **corrections**, the same engine with longer prompts): the trainer's residue
  (its parameter and optimizer shards: gradients are freed after each step) and the vLLM
  engine, which takes ``gpu_memory_utilization`` of the GPU for its weights (``1/tp`` of the
  model in the engine's dtype), a working reserve (`vllm_reserve`: what its profile run of
  ``max_num_batched_tokens`` tokens and ``max_num_seqs`` sampled rows needs, plus a base), and
  the KV cache in the rest. The HF engine instead gathers the whole model (FSDP2) and keeps
  every sequence's cache at once.
* **weight sync**: the residue, the engine's weights (awake without its KV cache), the largest
  tensor gathered in full and cast (the sync streams one tensor at a time), and what a
  sleeping engine keeps resident.
* **update**: sharded parameters, gradients and AdamW's two moments, then the larger of two
  moments (`update_moments`): the backward (the decoder layers FSDP2 gathers: the current one,
  the prefetched next, the current one's full gradient before its reduce-scatter, or an untied
  LM head with its gradient, whichever is larger; the activations autograd keeps for the
  longest micro-batch, `ModelShape.activation_bytes` (packed, ``rollout.packing``: one
  sequence of up to ``micro_batch_tokens`` real tokens, `RunShape.packed_tokens`; under SDPA or
  eager its N x N attention tensors, `packed_attention_bytes`, below; unpacked, a micro-batch's
  rows x L x L ones, `padded_attention_bytes`); autocast's weight copies saved for
  backward; the log-prob head's chunk of logits: 10 bytes a logit over the micro-batch's
  response positions, the only ones the head sees) or the optimizer step (foreach AdamW, torch's
  kernel for FSDP2's DTensor shards on a GPU, makes one float32 temporary the size of the shard;
  the fused kernel none). A vLLM engine that does not sleep keeps its share; one that sleeps
  keeps its CUDA-graph pool and NCCL buffers.

Packed attention under SDPA / eager (measured with autograd's saved-tensor hooks on the CPU,
transformers 5.x, tests/plan/test_packed_attention_memory.py): transformers builds one boolean
N x N mask for the packed sequence (1 byte an entry); SDPA converts it to an additive mask in
the compute dtype in every attention layer and saves that copy for backward (``c`` bytes an
entry per layer); eager builds the additive mask once (``c`` bytes an entry) and saves the
softmax's N x N output per head and layer. With gradient checkpointing one layer's
saved tensors live at once (the mask is each layer's input). Flash-attention's varlen kernels
hold nothing quadratic, flex attention a block mask of (N / 128)^2 entries (not counted).

Padded attention under SDPA / eager (measured the same way, tests/plan/test_padded_attention_memory.py,
through the update's own per-row forward, ``training/logprobs.py``: prompts left-padded,
responses right-padded, one micro-batch of R rows trimmed to L = its longest prompt + longest
response): where the micro-batch has padding, SDPA gets a boolean mask [R, 1, L, L] (1 byte an
entry, built once) and every attention layer saves its float copy [R, 1, L, L] in the compute
dtype; without padding (rows of equal lengths, or one row) transformers 5.x passes no mask and
SDPA runs causal: nothing quadratic. Eager builds the float mask [R, 1, L, L] whatever the
padding and saves the softmax's output [R, heads, L, L] per layer. So the same bytes as packed
with R x L^2 entries for N^2 (`dense_attention_bytes`). The plan assumes padding wherever a
micro-batch has two rows or more (unequal lengths are the normal case). Gradient checkpointing:
the forward saves none of them (the recomputed layer does, in backward: one layer's at a time,
as packed). The shared-prompt forward (no FSDP2, no checkpointing) masks its prompt forward
[U, 1, Lp, Lp] and each response bucket [rows, 1, Lr, Lp + Lr]: less than R x L^2, so the
count bounds it.

Every phase adds ``overhead_gib`` (CUDA context, NCCL buffers, the allocator's slack). The
constants no GPU has measured are `ibpo_lit.plan.constants`'; `ibpo_lit.plan.calibration` fits
the update's from measured peaks (`scripts/gpu_check.py`).

Autocast copies: Lightning 2.6's precision plugin (``lightning/pytorch/plugins/precision/amp.py``,
``autocast_context_manager``) runs ``torch.autocast(..., cache_enabled=False)``, so no bf16 copy
of the weights outlives an op: the rollout and the sync hold none. In a forward with gradient
each matmul still saves its bf16 weight copy for backward (checked with autograd's
saved-tensor hooks, cache on or off), so the update holds them: every layer's without gradient
checkpointing, the recomputed layer's with it. FSDP2's mixed precision gathers bf16 weights
instead (the gathered units).
"""
from __future__ import annotations

from typing import Optional

from ibpo_lit.plan import constants
from ibpo_lit.plan.run import RunShape
from ibpo_lit.plan.shapes import ModelShape
from ibpo_lit.models.attention import attention_kind, packs_under

GIB = 1024 ** 3
PADDED_MASKS = "attention masks (padded, rows x L x L)"  # a part of the update (backward_transients)
ADAMW_STATES = 2
UPDATE_STATE = ("parameters", "optimizer (AdamW)", "gradients", "DDP gradient buckets")
"""The update's persistent parts (the rest are its transients, or an engine's)."""


def trainer_state(model: ModelShape, run: RunShape, with_grads: bool) -> dict[str, float]:
    """The trainer's persistent tensors on one GPU (FSDP2: its shard; otherwise a full copy)."""
    share = model.params * run.param_bytes / run.shard_degree
    parts = {"parameters": share, "optimizer (AdamW)": ADAMW_STATES * share}
    if with_grads:
        parts["gradients"] = share
        if not run.sharded and run.processes > 1:
            parts["DDP gradient buckets"] = share
    return parts


def engine_share(run: RunShape, device_bytes: float) -> float:
    return run.gpu_memory_utilization * device_bytes


def engine_weights(model: ModelShape, run: RunShape) -> float:
    return model.params * run.engine_bytes / run.tensor_parallel


def vllm_reserve(model: ModelShape, run: RunShape) -> float:
    """vLLM's working memory inside its share, on one GPU: its profile run forwards
    ``max_num_batched_tokens`` tokens (the widest activations of one layer live at once: the
    residual stream and its norm, q/k/v and the attention output, the MLP's gate-up and
    activation, tensor-parallel ones split) and samples ``max_num_seqs`` rows of float32 logits;
    CUDA graphs and buffers are a base on top. What it measures is what the KV cache cannot use."""
    tp, c = run.tensor_parallel, run.engine_bytes
    per_token = c * (2 * model.hidden + (2 * model.q_width + 2 * model.kv_width + 3 * model.mlp_width) / tp)
    sampler = run.max_num_seqs * model.vocab * 4 * constants.VLLM_SAMPLER_COPIES.value
    return constants.VLLM_BASE_RESERVE_GIB.value * GIB + run.max_num_batched_tokens * per_token + sampler


def kv_capacity_tokens(model: ModelShape, run: RunShape, device_bytes: float) -> float:
    """Tokens the engine's KV cache holds on one GPU (its share, less weights and reserve)."""
    free = engine_share(run, device_bytes) - engine_weights(model, run) - vllm_reserve(model, run)
    return max(0.0, free) / model.kv_bytes_per_token(run.tensor_parallel, run.engine_bytes)


def asleep(run: RunShape) -> dict[str, float]:
    """What a sleeping vLLM engine keeps on the GPU (nothing for an engine that does not sleep)."""
    if run.backend == "vllm" and run.sleep_mode and run.on_gpu:
        return {"vLLM asleep (CUDA-graph pool, NCCL buffers)": constants.VLLM_ASLEEP_GIB.value * GIB}
    return {}


def rollout_memory(model: ModelShape, run: RunShape, device_bytes: float, sequences: int,
                   sequence_tokens: int) -> dict[str, float]:
    """One GPU while the engine generates ``sequences`` of up to ``sequence_tokens`` tokens."""
    parts = trainer_state(model, run, with_grads=False)
    if run.backend == "vllm":
        parts["vLLM engine (weights, reserve, KV cache)"] = engine_share(run, device_bytes)
        return parts
    if run.backend == "vllm_server":  # the engine lives on GPUs of its own: the trainer's hold its state only
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
    """One of the trainer's GPUs during the weight sync (vLLM in process or a vLLM server)."""
    parts = trainer_state(model, run, with_grads=False)
    if run.backend == "vllm":  # colocated: the engine's weights share the GPU (a server's do not)
        parts["engine weights"] = engine_weights(model, run)
    parts["one tensor gathered and cast"] = model.largest_tensor * (run.param_bytes + run.engine_bytes)
    parts.update(asleep(run))
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


def packed(model: ModelShape, run: RunShape) -> bool:
    """Whether the update's forwards are packed (``rollout.packing`` under the model's attention,
    as ``training/packing.py`` decides it)."""
    return packs_under(run.packing, attention_kind(model.attention))


def dense_attention_bytes(model: ModelShape, run: RunShape, entries: float, masked: bool = True) -> float:
    """The quadratic tensors SDPA or eager keeps for backward over ``entries`` query x key
    entries of one head (N^2 packed, rows x L^2 padded; see the module docstring): eager its
    float mask once and the softmax's output per head in each layer whose saved tensors live at
    once; SDPA, only where a mask is built (``masked``), the bool mask once and its float copy
    per such layer. 0 under flash-attention's varlen kernels or flex attention."""
    if attention_kind(model.attention) != "dense":
        return 0.0
    c = run.compute_bytes
    kept = 1 if run.checkpointing else model.attention_layers  # layers whose saved tensors live at once
    if model.attention == "eager":  # the float mask, and per layer the softmax's output, per head
        return entries * c * (1 + model.heads * kept)
    return entries * (1 + c * kept) if masked else 0.0  # SDPA: the bool mask, and per layer its float copy


def packed_attention_bytes(model: ModelShape, run: RunShape, tokens: int) -> float:
    """The N x N attention tensors a packed micro-batch of ``tokens`` (N) tokens keeps for
    backward under SDPA or eager (`dense_attention_bytes`); 0 unpacked."""
    if not packed(model, run):
        return 0.0
    return dense_attention_bytes(model, run, float(tokens) ** 2)


def padded_attention_bytes(model: ModelShape, run: RunShape, rows: int, row_tokens: int) -> float:
    """The rows x L x L attention tensors an unpacked micro-batch of ``rows`` rows padded to
    ``row_tokens`` (L) tokens keeps for backward under SDPA or eager (`dense_attention_bytes`);
    0 packed. Padding is assumed wherever a micro-batch has two rows or more (rows of unequal
    lengths are the normal case; the plan is an upper bound): SDPA then gets a mask, which
    transformers skips for a micro-batch without padding (one row: a row is trimmed to its own
    length). Eager builds its mask and keeps its softmax whatever the padding."""
    if packed(model, run):
        return 0.0
    return dense_attention_bytes(model, run, rows * float(row_tokens) ** 2, masked=rows > 1)


def backward_transients(model: ModelShape, run: RunShape, longest_row: int) -> dict[str, float]:
    """What the update's backward holds beside the trainer's state, for micro-batches of
    ``micro_batch_size`` rows of ``longest_row`` tokens (fewer under ``micro_batch_tokens``;
    packed, one sequence of up to ``RunShape.packed_tokens``)."""
    parts = {"gathered units": gathered_units(model, run)}
    rows = run.micro_batch_rows(longest_row)
    tokens = run.packed_tokens(longest_row) if packed(model, run) else rows * longest_row
    parts["activations (longest micro-batch)"] = model.activation_bytes(tokens, run.compute_bytes, run.checkpointing)
    mask = packed_attention_bytes(model, run, tokens)
    if mask:
        parts["attention masks (packed, N x N)"] = mask
    padded = padded_attention_bytes(model, run, rows, longest_row)
    if padded:
        parts[PADDED_MASKS] = padded
    if not run.sharded and run.compute_bytes < run.param_bytes:  # see "Autocast copies" above
        layers = model.layer_params if run.checkpointing else model.params
        parts["autocast copies saved for backward"] = layers * run.compute_bytes
    positions = rows * min(longest_response(run), longest_row)
    chunk = min(run.logprob_chunk_tokens or positions, positions)
    parts["log-prob head chunk"] = chunk * model.vocab * constants.LOGIT_BYTES.value
    return parts


def optimizer_step_temporary(model: ModelShape, run: RunShape) -> float:
    """AdamW's temporaries at its step: foreach makes one float32 list the size of the whole
    shard (``exp_avg_sq.sqrt()``, torch/optim/adam.py ``_multi_tensor_adam``); the per-tensor
    loop (CPU) one tensor's; the fused kernel none."""
    if run.adamw_kernel == "foreach":
        return model.params * run.param_bytes / run.shard_degree
    if run.adamw_kernel == "single":
        return model.largest_tensor * run.param_bytes / run.shard_degree
    return 0.0


def update_moments(model: ModelShape, run: RunShape, longest_row: int) -> tuple[dict[str, float], dict[str, float], float]:
    """``(state, backward, step)``: the update's persistent parts, its backward's transients and
    its optimizer step's temporary (bytes). Its peak is ``state + max(backward, step)``, the
    shape `ibpo_lit.plan.calibration` fits."""
    return (trainer_state(model, run, with_grads=True), backward_transients(model, run, longest_row),
            optimizer_step_temporary(model, run))


def update_memory(model: ModelShape, run: RunShape, device_bytes: float, longest_row: int) -> dict[str, float]:
    """One GPU in the update (see the module docstring)."""
    state, backward, step = update_moments(model, run, longest_row)
    parts = {**state, **backward}
    beyond = step - sum(backward.values())
    if beyond > 0:  # the backward's transients are freed by then: only the excess counts
        parts["AdamW step temporary beyond backward"] = beyond
    if run.backend == "vllm" and not run.sleep_mode and run.on_gpu:
        parts["vLLM engine (awake: no sleep mode)"] = engine_share(run, device_bytes)
    parts.update(asleep(run))
    return parts


def total(parts: dict[str, float], overhead_bytes: float) -> float:
    return sum(parts.values()) + overhead_bytes


def longest_response(run: RunShape) -> int:
    """The longest response the update trains (a correction's when corrections are trained)."""
    if run.corrections and run.train_on_corrections:
        return max(run.max_new_tokens, run.correction_new_tokens)
    return run.max_new_tokens


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
