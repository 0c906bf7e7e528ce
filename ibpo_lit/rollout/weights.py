"""The policy's full weights, one tensor at a time, whatever shards them.

A rollout engine needs every weight whole and under its checkpoint name
(``model.layers.0.self_attn.q_proj.weight``), while the trainer may hold them sharded.
``iter_full_weights`` yields ``(name, tensor)`` lazily, so a consumer that copies each tensor
before asking for the next (vLLM's ``load_weights`` does) never holds more than a few
gathered tensors at once:

* plain tensors (one process, DDP): yielded as they are, no copy;
* FSDP2 / ``DTensor`` parameters: ``full_tensor()`` gathers one parameter;
* FSDP1 (``FullyShardedDataParallel``, Lightning's ``FSDPStrategy``): each FSDP unit is
  unsharded on its own (``summon_full_params(unit, recurse=False)``) and its parameters are
  cloned out before it is resharded, so only one unit (about one decoder layer) is whole at
  a time. Every rank must iterate (the gathers are collectives).

Names are cleaned of the wrappers' prefixes (``_fsdp_wrapped_module.``,
``_checkpoint_wrapped_module.``, ``_orig_mod.``). Tied weights appear once, under the first
name (``lm_head.weight`` of a tied model is skipped, as in its checkpoint).
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor

_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "module.")


def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def iter_full_weights(model: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``(checkpoint name, full tensor)`` for every parameter and persistent buffer of ``model``."""
    fsdp_units = _fsdp_units(model)
    if fsdp_units:
        yield from _iter_fsdp1(model, fsdp_units)
        return
    seen: set[int] = set()
    for name, tensor in _named_tensors(model):
        if id(tensor) in seen:  # tied weights: once
            continue
        seen.add(id(tensor))
        yield clean_name(name), _full(tensor).detach()


def _named_tensors(module: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    yield from module.named_parameters(remove_duplicate=False)
    persistent = set(module.state_dict(keep_vars=True).keys())
    for name, buffer in module.named_buffers(remove_duplicate=False):
        if name in persistent:  # non-persistent buffers (rotary inv_freq) are not weights
            yield name, buffer


def _full(tensor: Tensor) -> Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)  # DTensor (FSDP2, tensor parallel)
    return full_tensor() if callable(full_tensor) else tensor


def _fsdp_units(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:  # torch built without distributed
        return []
    return [(name, m) for name, m in model.named_modules() if isinstance(m, FSDP)]


def _iter_fsdp1(model: torch.nn.Module, units) -> Iterator[tuple[str, Tensor]]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    unit_names = [name for name, _ in units]
    seen: set[str] = set()
    for unit_name, unit in units:
        nested = [n for n in unit_names if n != unit_name and n.startswith(unit_name + "." if unit_name else "")]
        with FSDP.summon_full_params(unit, writeback=False, recurse=False):
            for name, tensor in unit.named_parameters():
                full_name = f"{unit_name}.{name}" if unit_name else name
                if any(full_name.startswith(n + ".") for n in nested):
                    continue  # owned by an inner unit, gathered with it
                cleaned = clean_name(full_name)
                if cleaned in seen:
                    continue
                seen.add(cleaned)
                # Clone: the unsharded storage is freed when the unit reshards.
                yield cleaned, tensor.detach().clone()
