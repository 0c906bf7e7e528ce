"""FSDP2 for Hugging Face causal LMs: the shard plan, loading at scale, gathered weights.

What is covered:
    * `shard_model`: ``fully_shard`` on every decoder layer (the classes Hugging Face lists in
      ``model._no_split_modules``); on the input embedding and on the LM head, each a unit of
      its own, when they are not tied; then on the root, which keeps the final norm (and a tied
      embedding and head: one parameter belongs to one unit, see `untied_embeddings`). Mixed
      precision is FSDP2's own ``MixedPrecisionPolicy``: parameters cast to ``param_dtype``
      (bf16) for compute, gradients reduced in ``reduce_dtype`` (fp32), master weights and
      optimizer state in the parameters' dtype (fp32).
    * Units are gathered only while they compute. An untied embedding and head follow the
      decoder layers' ``reshard_after_forward`` (Qwen3-32B's head is 151936 x 5120, 1.56 GB in
      bf16: in the root it stayed gathered from the start of every forward to its backward).
      FSDP2 leaves the root gathered after its forward (its backward would gather it again at
      once) and reshards it in that backward; a forward without autograd (``torch.no_grad``:
      the old-logprob pass, the weight-sync probe, CIW scoring) has none, so a forward hook on
      the root (`_ReshardAfterNoGrad`) reshards every unit, the root included, after it.
    * `build_sharded`: the model built on the meta device on every rank, sharded, given empty
      storage for its shards only, then filled from a full state dict that only rank 0 holds
      (``set_model_state_dict(..., broadcast_from_rank0=True)``: rank 0 broadcasts one tensor
      at a time and every rank keeps its shard). So one full copy of the weights exists in CPU
      memory in the whole job (rank 0's), not one per rank. Non-persistent buffers (the rotary
      ``inv_freq``) are not in a state dict: they are recomputed in float32 by the model's own
      ``_init_weights``, and tied parameters are tied again.
    * `gathered_weights`: every unit unsharded for the duration of a block and not resharded
      after each forward (no-grad forwards included), so a block of forwards whose number
      differs between ranks (token by token decoding) runs no collective. Costs one full copy
      of the weights (in the compute dtype) per rank while it lasts; use vLLM rollouts for
      models where that does not fit.
    * `fp32_rotary_buffers`: recompute non-persistent buffers in float32 after anything cast the
      module (a ``bf16-true`` precision plugin, ``model.to(bfloat16)``): positions up to 32k
      multiplied by a bfloat16 ``inv_freq`` (8 bits of mantissa) give wrong rotary angles.

What is not covered:
    * Tensor parallelism of the trained model (only data-parallel sharding); expert parallelism.
    * Models without ``_no_split_modules`` (then the root holds every decoder weight: correct,
      but one all-gather holds them all).
    * A tied embedding and head split into two units: they are one parameter, gathered from
      the first operation of the forward to the last, so they stay in the root.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
from torch import nn


@dataclass
class FSDP2Plan:
    """How `shard_model` shards a model.

    Args:
        mesh: The 1-D data-parallel device mesh the parameters are sharded over.
        param_dtype: Compute dtype of the gathered parameters (``torch.bfloat16`` under
            ``bf16-mixed``); None keeps the parameters' own dtype.
        reduce_dtype: Dtype of the gradient reduce-scatter (float32: bf16 sums over many ranks
            lose the small gradients RL updates are made of).
        reshard_after_forward: Free each layer's gathered parameters after its forward (gather
            again in backward): less memory, one more all-gather per layer.
        cpu_offload: Keep the shards and their optimizer state in CPU memory.
    """

    mesh: object
    param_dtype: Optional[torch.dtype] = None
    reduce_dtype: Optional[torch.dtype] = torch.float32
    reshard_after_forward: bool = True
    cpu_offload: bool = False

    @property
    def device(self) -> torch.device:
        mesh_device = torch.device(self.mesh.device_type)
        if mesh_device.type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return mesh_device


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's blocks that must not be split (``_no_split_modules``: its decoder layers),
    before or after sharding (``fully_shard`` subclasses each: FSDPQwen3DecoderLayer)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    return [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]


def untied_embeddings(model: nn.Module) -> list[nn.Module]:
    """The input embedding and the LM head (``get_input_embeddings``/``get_output_embeddings``)
    that `shard_model` makes units of their own: both when they share no parameter, none when
    they are tied.

    A tied pair stays in the root. FSDP2 manages a parameter in one unit only (it refuses a
    parameter shared between two), and one unit over both modules would be gathered from the
    embedding lookup, the forward's first operation, to the head, its last: the root's
    lifetime, so nothing would be saved."""
    found = []
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        try:
            module = getattr(model, getter)()
        except (AttributeError, NotImplementedError):  # not a Hugging Face model, or no such module
            module = None
        if module is not None and module is not model and any(True for _ in module.parameters()):
            found.append(module)
    if len(found) == 2:
        first = {id(p) for p in found[0].parameters()}
        if found[0] is found[1] or any(id(p) in first for p in found[1].parameters()):
            return []
    return found


def shard_model(model: nn.Module, plan: FSDP2Plan) -> nn.Module:
    """``fully_shard`` each decoder layer, an untied embedding and head, then the root (see the
    module docstring)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    kwargs = {
        "mesh": plan.mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=plan.param_dtype, reduce_dtype=plan.reduce_dtype),
        "offload_policy": CPUOffloadPolicy() if plan.cpu_offload else OffloadPolicy(),
    }
    for module in [*decoder_layers(model), *untied_embeddings(model)]:
        fully_shard(module, reshard_after_forward=plan.reshard_after_forward, **kwargs)
    fully_shard(model, **kwargs)  # the root: FSDP2 keeps it gathered from forward to backward
    # Registered after fully_shard's own post-forward hook, so it runs after it.
    hook = _ReshardAfterNoGrad(fsdp_modules(model))
    model.register_forward_hook(hook)
    model._ibpo_no_grad_reshard = hook  # for gathered_weights to hold it off
    return model


class _ReshardAfterNoGrad:
    """Forward hook on the root unit: after a forward run without autograd, reshard every unit.

    FSDP2 (torch 2.13, ``FSDPState._lazy_init``) does not reshard the root after its forward,
    and the root's post-backward reshards it; a no-grad forward has no backward, so without
    this hook the root (and every unit, with ``reshard_after_forward=False``) would stay
    gathered until the next training backward. Resharding is local (it frees the gathered
    copy; no collective): a later forward or backward gathers a unit again in its own
    pre-hook, as after any forward that resharded it, and forwards are collectives that every
    rank already runs alike. ``held`` > 0 (inside `gathered_weights`) leaves everything
    gathered."""

    def __init__(self, units: list[nn.Module]) -> None:
        self.units = units
        self.held = 0

    def __call__(self, module: nn.Module, args, output) -> None:
        if torch.is_grad_enabled() or self.held:
            return None
        for unit in self.units:
            unit.reshard()
        return None


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch built without distributed
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: Optional[nn.Module]) -> bool:
    """Whether ``model``'s forward passes are collectives (FSDP2 units in it)."""
    return model is not None and bool(fsdp_modules(model))


def build_sharded(
    build_meta: Callable[[], nn.Module],
    full_state_dict: Callable[[], dict[str, torch.Tensor]],
    plan: FSDP2Plan,
) -> nn.Module:
    """A sharded model with the weights rank 0 loads (see the module docstring).

    Args:
        build_meta: Builds the model's structure; called under ``torch.device("meta")`` on
            every rank.
        full_state_dict: Loads the full weights (called on global rank 0 only).
        plan: How to shard.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    with torch.device("meta"):
        model = build_meta()
    tied = _tied_parameter_names(model)
    shard_model(model, plan)
    model.to_empty(device=plan.device)
    for unit in fsdp_modules(model):
        unit.reshard()  # re-registers each sharded parameter on every module sharing it (ties)
    fp32_rotary_buffers(model)
    state = full_state_dict() if dist.get_rank() == 0 else {}
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del state
    for names in tied:
        first = model.get_parameter(names[0])
        if any(model.get_parameter(n) is not first for n in names[1:]):
            raise RuntimeError(f"tied parameters {names} lost their tie while sharding")
    return model


def _tied_parameter_names(model: nn.Module) -> list[list[str]]:
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def fp32_rotary_buffers(model: nn.Module) -> None:
    """Recompute every non-persistent floating buffer in float32 with the model's own
    ``_init_weights`` (Hugging Face's initialiser recomputes rotary ``inv_freq`` there).

    Only modules without parameters of their own are re-initialised (rotary embeddings), so no
    weight is touched."""
    init = getattr(model, "_init_weights", None)
    for module in model.modules():
        names = [n for n in getattr(module, "_non_persistent_buffers_set", ()) if module._buffers.get(n) is not None]
        if not names or any(True for _ in module.parameters(recurse=False)):
            continue
        if not any(module._buffers[n].is_floating_point() for n in names):
            continue
        for n in names:
            buffer = module._buffers[n]
            if buffer.is_floating_point() and buffer.dtype != torch.float32:
                module._buffers[n] = buffer.float()
        if callable(init):
            for n in names:  # _init_weights writes only buffers it knows; clear the flag it checks
                if hasattr(module._buffers[n], "_is_hf_initialized"):
                    del module._buffers[n]._is_hf_initialized
            init(module)


@contextmanager
def gathered_weights(model: nn.Module, reshard_after_forward: bool = True) -> Iterator[None]:
    """Every FSDP2 unit of ``model`` unsharded while the block runs (nothing for an unsharded
    model). Entering is a collective: every rank must enter as many times. Inside, forwards
    run no collective, so each rank may run as many as it needs: nothing reshards after them,
    no-grad forwards included (`_ReshardAfterNoGrad` is held off).

    ``reshard_after_forward`` is the setting to restore on exit for every unit but the root
    (decoder layers, an untied embedding and head: the plan's one value); the root's is
    always False, FSDP2's default for it."""
    units = fsdp_modules(model)
    if not units:
        yield
        return
    holds = [h for h in (getattr(u, "_ibpo_no_grad_reshard", None) for u in units) if h is not None]
    for hold in holds:
        hold.held += 1
    try:
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
        for unit in units:
            unit.unshard()
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(reshard_after_forward and unit is not model, recurse=False)
        for hold in holds:
            hold.held -= 1
