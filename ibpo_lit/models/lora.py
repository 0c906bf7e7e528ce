"""LoRA through ``peft`` (``model.lora``): only the adapters train, the base stays frozen.

What the rest of the trainer needs from a LoRA policy, in one place:

- ``apply_lora``: wrap a loaded causal LM with peft's ``get_peft_model`` (adapters initialised so
  that the wrapped model computes exactly what the base does: ``B = 0``).
- ``merged_weights``: the policy as a plain model's checkpoint, every adapter folded into its
  base weight (``W + scale * B A``), computed out of place: what a rollout engine (vLLM) loads at
  each sync, and what ``export`` writes. Merging in place (peft's ``merge_adapter`` then
  ``unmerge_adapter``) would leave ``W + BA - BA`` in the trained weights, a float error that
  grows with every sync.
- ``reference_of``: the KL reference of a LoRA policy is its base, the adapters switched off
  (peft's ``disable_adapter``), instead of a second copy of the model.
- ``adapter_state``: the trainable tensors' names, the only ones a LoRA checkpoint needs.

Not covered: LoRA on a model sharded with FSDP2 (the command line refuses the combination),
and vLLM's own LoRA serving (the merged weights go through the ordinary sync instead).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Union

import torch
from torch import Tensor


@dataclass
class LoRAConfig:
    """Low-rank adapters (TRL's ``peft_config``, verl's ``lora_rank``/``lora_alpha``).

    Args:
        r: Rank of each adapter.
        alpha: Scale numerator: an adapter adds ``(alpha / r) * B A`` to its weight.
        dropout: Dropout on the adapters' input while training.
        target_modules: Module names to adapt (e.g. ``[q_proj, k_proj, v_proj, o_proj]``), or
            ``all-linear`` (every linear layer but the output head, peft's shorthand).
    """

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: Union[str, list[str]] = field(default="all-linear")

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"model.lora.r must be >= 1, got {self.r}")
        if not self.alpha > 0:
            raise ValueError(f"model.lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")


def apply_lora(model: torch.nn.Module, cfg: LoRAConfig) -> torch.nn.Module:
    """``model`` wrapped by peft: base weights frozen, adapters trainable."""
    from peft import LoraConfig, get_peft_model

    peft_cfg = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                          target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    model = get_peft_model(model, peft_cfg)
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(trainable_summary(model))
    return model


def trainable_summary(model: torch.nn.Module) -> str:
    """``LoRA: training 1,234,567 of 135,000,000 parameters (0.91%)``: what a LoRA run trains
    (peft's own count, which counts each tied weight once)."""
    trainable, total = model.get_nb_trainable_parameters()
    return f"LoRA: training {trainable:,} of {total:,} parameters ({100 * trainable / max(total, 1):.2f}%)"


def is_lora(model: torch.nn.Module | None) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    return {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}


@torch.no_grad()
def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` of every parameter and persistent buffer of the base model, under its
    own names (``model.layers.0...``), with every adapter folded in, one tensor at a time; tied
    weights once, as ``rollout.weights.iter_full_weights`` yields a plain model's. The trained
    weights are not touched."""
    layers = _lora_layers(model)
    base = model.get_base_model()
    persistent = set(base.state_dict(keep_vars=True))
    named = [*base.named_parameters(remove_duplicate=False),
             *((n, b) for n, b in base.named_buffers(remove_duplicate=False) if n in persistent)]
    seen: set[int] = set()
    for name, tensor in named:
        if ".lora_" in name or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        tensor = tensor.detach()
        owner, _, leaf = name.rpartition(".base_layer.")
        if owner and owner in layers and leaf == "weight":
            layer = layers[owner]
            delta = sum(layer.get_delta_weight(adapter) for adapter in layer.active_adapters)
            yield f"{owner}.weight", tensor + delta.to(tensor.dtype)
        elif owner and owner in layers:
            yield f"{owner}.{leaf}", tensor
        else:
            yield name, tensor


@contextmanager
def reference_of(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The base model (adapters off) for the duration of the block: LoRA's KL reference."""
    with model.disable_adapter():
        yield model


def adapter_state(model: torch.nn.Module) -> set[str]:
    """Names (in ``model.named_parameters()``) of the trainable tensors: the adapters."""
    return {name for name, p in model.named_parameters() if p.requires_grad}
