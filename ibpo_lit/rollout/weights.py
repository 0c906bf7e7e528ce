"""The policy's full weights, one tensor at a time, under their checkpoint names.

A rollout engine loads weights the way it loads a checkpoint: every tensor whole, under the
name the model's files use (``model.layers.0.self_attn.q_proj.weight``), while the trainer may
hold them sharded and in its own layout. ``iter_full_weights`` yields ``(name, tensor)``
lazily, so a consumer that copies each tensor before asking for the next (vLLM's
``load_weights`` does) never holds more than a few gathered tensors at once:

* plain tensors (one process, DDP): yielded as they are, no copy;
* FSDP2 / ``DTensor`` parameters: ``full_tensor()`` gathers one parameter (a collective: every
  rank must iterate, in the same order, which ``named_parameters`` guarantees). The root
  unit's parameters (embeddings, final norm, LM head) are parameters like any other here.
  Given the engine's ``dtype``, each shard is cast before it is gathered: a bf16 engine of an
  fp32-master model then moves half the bytes of gathering fp32 and casting after, with
  the same values (a cast is elementwise).
* checkpoint layout: transformers 5 keeps some weights in a layout of its own, e.g. a
  mixture-of-experts layer's experts packed into 3-D tensors (``mlp.experts.gate_up_proj``)
  where checkpoints and vLLM's loader have one tensor per expert and projection
  (``mlp.experts.3.gate_proj.weight``). Each tensor goes through transformers' own
  ``revert_weight_conversion`` (what ``save_pretrained`` uses), so the engine receives the
  names and shapes of the model's files.

* LoRA (peft): the base model's tensors with every adapter folded in
  (``ibpo_lit.models.lora.merged_weights``): the engine serves the merged model.

Names are cleaned of wrappers' prefixes (``_checkpoint_wrapped_module.``, ``_orig_mod.``).
Tied weights appear once, under the first name (a tied model's ``lm_head.weight`` is skipped, as
in its checkpoint). Non-persistent buffers (rotary ``inv_freq``) are not weights.

`SyncManifest` records what one pass yielded, so a caller can check that every parameter of the
model reached the engine (one stale tensor, such as an embedding the iterator never reached,
would otherwise go unnoticed by a short probe at a small learning rate).

`WeightSyncContext` is what a weight sync needs from the run (the engine, the policy, which
weights it holds, ...), built by the module (`IBPOModule.weight_sync_context`) each time the
weight-sync callback asks, so the callback never reaches into the module.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator

import torch
from torch import Tensor

from ibpo_lit.rollout.engine import RolloutEngine
from ibpo_lit.scale.collectives import RankSync

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.", "module.")


def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


@dataclass
class SyncManifest:
    """What one pass of `iter_full_weights` yielded."""

    expected: set[str] = field(default_factory=set)  # the model's tensor names (its own layout)
    sent_model_names: set[str] = field(default_factory=set)  # of those, the ones yielded
    sent: list[str] = field(default_factory=list)  # the names the engine received (checkpoint layout)
    gathered_bytes: int = 0  # bytes of the tensors gathered from shards (what the sync moves between ranks)

    def missing(self) -> list[str]:
        """The model's tensors that were not yielded (an incomplete sync)."""
        return sorted(self.expected - self.sent_model_names)


@dataclass(frozen=True)
class WeightSyncContext:
    """What keeping a separate rollout engine on the policy's weights needs from the run, as it
    is when asked for (``callbacks.VLLMWeightSync`` reads nothing else of the module)."""

    engine: RolloutEngine  # sync_weights(named tensors), generate(...); sleep(level) where it can_sleep
    policy: torch.nn.Module  # the trained model: its weights are sent, its forward checks the probe
    tokenizer: Any  # encodes the probe prompt
    weights_version: int  # optimizer steps taken (skipped ones excluded): the weights the policy holds
    num_mini_batches: int  # optimizer steps each update takes
    device: torch.device  # where the trainer's probe forward runs
    sync: RankSync  # the run's collectives: every rank takes the worst rank's probe verdict
    # The trainer's precision context of a forward (autocast under bf16-mixed; nothing under
    # FSDP2's own mixed precision): the probe's forward is the one the update computes.
    forward_context: Callable[[], ContextManager] = nullcontext


def expected_tensor_names(model: torch.nn.Module) -> set[str]:
    """Every parameter and persistent buffer of ``model``, tied ones once (its own layout)."""
    return {clean_name(name) for name, _ in _unique_tensors(model)}


def iter_full_weights(model: torch.nn.Module, manifest: SyncManifest | None = None,
                      dtype: torch.dtype | None = None) -> Iterator[tuple[str, Tensor]]:
    """``(checkpoint name, full tensor)`` for every parameter and persistent buffer of
    ``model``; fills ``manifest`` (if given) as it goes. ``dtype``: the engine's, to which
    sharded floating-point tensors are cast before they are gathered (None: as they are;
    unsharded tensors are left to the engine's own copy)."""
    from ibpo_lit.models.lora import is_lora, merged_weights

    if is_lora(model):
        tensors, model = merged_weights(model), model.get_base_model()
    else:
        tensors = _unique_tensors(model)
    if manifest is not None:
        manifest.expected = {clean_name(n) for n, _ in _unique_tensors(model) if ".lora_" not in n}
        manifest.expected = {n.replace(".base_layer.", ".") for n in manifest.expected}
    for name, tensor in tensors:
        name = clean_name(name)
        full = _full(tensor, dtype).detach()
        if manifest is not None:
            manifest.sent_model_names.add(name)
            if full is not tensor:
                manifest.gathered_bytes += full.numel() * full.element_size()
        for out_name, out_tensor in to_checkpoint_layout(model, name, full):
            if manifest is not None:
                manifest.sent.append(out_name)
            yield out_name, out_tensor


def to_checkpoint_layout(model: torch.nn.Module, name: str, tensor: Tensor) -> list[tuple[str, Tensor]]:
    """``[(name, tensor), ...]`` of one of ``model``'s tensors in its checkpoint's layout: the
    same pair for most, one per expert and projection for packed experts."""
    revert = _reverter(model)
    if revert is None:
        return [(name, tensor)]
    converted = revert(model, {name: tensor})
    return list(converted.items())


def _reverter(model: torch.nn.Module):
    """transformers' ``revert_weight_conversion`` when the model has weight conversions (None
    for models loaded as stored, and outside transformers)."""
    if not hasattr(model, "config"):
        return None
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: weights are stored as they are named
        return None
    has = getattr(model, "_ibpo_has_conversions", None)
    if has is None:
        conversions = getattr(model, "_weight_conversions", None)
        if conversions is None:
            try:
                conversions = get_model_conversion_mapping(model, add_legacy=False)
            except Exception:  # noqa: BLE001 - an architecture transformers maps no conversion for
                conversions = None
        has = bool(conversions)
        model._ibpo_has_conversions = has
    return revert_weight_conversion if has else None


def _unique_tensors(model: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    seen: set[int] = set()
    for name, tensor in _named_tensors(model):
        if id(tensor) in seen:  # tied weights: once
            continue
        seen.add(id(tensor))
        yield name, tensor


def _named_tensors(module: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    yield from module.named_parameters(remove_duplicate=False)
    persistent = set(module.state_dict(keep_vars=True).keys())
    for name, buffer in module.named_buffers(remove_duplicate=False):
        if name in persistent:  # non-persistent buffers (rotary inv_freq) are not weights
            yield name, buffer


def _full(tensor: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    if not callable(getattr(tensor, "full_tensor", None)):  # a plain tensor: nothing to gather
        return tensor
    if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
        tensor = tensor.to(dtype)  # DTensor: each rank casts its own shard, no communication
    return tensor.full_tensor()  # DTensor (FSDP2, tensor parallel): one collective
