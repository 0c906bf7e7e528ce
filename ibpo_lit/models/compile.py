"""``model.torch_compile``: the trainer's forwards through ``torch.compile``d decoder layers.

What is covered:
    * Regional compilation (torchtitan's and transformers' recipe for training): each decoder
      layer's ``forward`` is compiled, not the whole model. The layers are instances of one
      class running the same code, so inductor compiles one graph (per grad mode and shape
      family) and every layer reuses it; the model's glue (embedding, rotary table, the head's
      matmul and its chunking) and FSDP2's hooks stay eager, around the compiled region, so
      sharding and activation checkpointing (transformers wraps the layer's ``__call__``,
      outside ``forward``) behave as without compilation. The log-prob head's reduction of the
      logits (``ibpo_lit/training/logprobs.py``) is compiled too when `is_compiled` says so.
    * Shapes: the first row length compiles a static graph, the second distinct one recompiles
      with dynamic lengths (dynamo's automatic dynamic shapes), after which lengths no longer
      recompile; the first steps pay the compilation (tens of seconds on a GPU, ~20 s a graph
      on a 2-core CPU).
    * Generation stays eager (`eager`): the HF engine's decode calls the same layers with a KV
      cache whose length changes every token, which would recompile until dynamo's limit and
      then fall back anyway; its speed is the decode's own business (docs/benchmarks.md).

What is not covered:
    * Compiling the whole model or the optimizer step; CUDA graphs (``mode="reduce-overhead"``):
      row lengths change every step.
    * Whether it pays: measured per device by ``scripts/bench_update.py`` (docs/benchmarks.md);
      on a CPU it mostly costs the compilation.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from ibpo_lit.scale.fsdp2 import decoder_layers

COMPILED_MARK = "_ibpo_compiled_forward"


def compile_decoder_layers(model: nn.Module) -> int:
    """``torch.compile`` the ``forward`` of each of ``model``'s decoder layers, in place; returns
    how many. Refuses a model whose decoder layers it cannot find (it would silently compile
    nothing)."""
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"model.torch_compile: no decoder layers found in {type(model).__name__} "
                         "(its _no_split_modules names none); set model.torch_compile: false")
    for layer in layers:
        if getattr(layer, COMPILED_MARK, False):
            continue
        # The bound forward, not the module: nn.Module.compile would trace the module's hooks too
        # (FSDP2's gathers), which must stay eager.
        layer.forward = torch.compile(layer.forward)
        setattr(layer, COMPILED_MARK, True)
    return len(layers)


def is_compiled(model: nn.Module) -> bool:
    """Whether `compile_decoder_layers` compiled ``model``'s layers."""
    return any(getattr(layer, COMPILED_MARK, False) for layer in decoder_layers(model))


@contextmanager
def eager() -> Iterator[None]:
    """Compiled functions run eagerly inside (``torch.compiler.set_stance("force_eager")``)."""
    with torch.compiler.set_stance("force_eager"):
        yield
