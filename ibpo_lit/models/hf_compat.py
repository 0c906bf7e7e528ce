"""transformers' renamed APIs, called by whichever name the installed version has.

Two names we use were renamed, and the old ones now warn on every run (FutureWarning or a
logged deprecation) and will go:

    * the KV cache, ``past_key_values`` -> ``cache``, as the forward keyword and as the output
      field (transformers 5.24; the old names go in 5.40);
    * ``is_gradient_checkpointing`` -> ``is_activation_checkpointing`` and
      ``gradient_checkpointing_enable`` -> ``activation_checkpointing_enable`` (transformers
      5.23; the old names go in v6).

We support transformers from 4.56 (the first with ``DynamicCache(config=...)`` and
``cache.layers``, which the rollout engine and the trainer's log-probs use), and those
versions have only the old names. So each name is decided once, at import, by looking for the
feature itself (a ``cache`` field on ``CausalLMOutputWithPast``, an
``is_activation_checkpointing`` attribute on ``PreTrainedModel``), not by comparing version
numbers, which dev builds and backports misreport.

What is covered:
    * ``cache_kwargs(cache)``: the forward keyword for a KV cache; ``output_cache(out)``: the
      cache a forward returned.
    * ``is_activation_checkpointing(model)`` and ``enable_activation_checkpointing(model)``, on a
      ``PreTrainedModel``, a PEFT wrapper (PEFT forwards unknown attributes to the base model)
      or an FSDP2-sharded model (``fully_shard`` keeps the class's attributes).

What is not covered:
    * Remote-code models (``trust_remote_code``) whose forward kept the old keyword under a new
      transformers; ibpo-lit loads none.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

# The output field and the forward keyword were renamed together (5.24), so the field tells both.
_OUTPUT_FIELDS = {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
CACHE_NAME = "cache" if "cache" in _OUTPUT_FIELDS else "past_key_values"
"""The KV cache's name in a causal LM's forward and output: ``cache`` or ``past_key_values``."""

# `is_activation_checkpointing` and `activation_checkpointing_enable` came together (5.23).
HAS_ACTIVATION_CHECKPOINTING = hasattr(PreTrainedModel, "is_activation_checkpointing")
"""Whether transformers names checkpointing ``activation_checkpointing`` (else ``gradient_checkpointing``)."""


def cache_kwargs(cache: Any) -> dict[str, Any]:
    """``{name: cache}`` to pass to a causal LM's forward (``model(**inputs, **cache_kwargs(c))``)."""
    return {CACHE_NAME: cache}


def output_cache(output: Any) -> Any:
    """The KV cache a causal LM's forward returned (``use_cache=True``)."""
    return getattr(output, CACHE_NAME)


def is_activation_checkpointing(model: torch.nn.Module) -> bool:
    """Whether activation (gradient) checkpointing is on; False for a model that has no such
    switch (not a transformers model)."""
    name = "is_activation_checkpointing" if HAS_ACTIVATION_CHECKPOINTING else "is_gradient_checkpointing"
    return bool(getattr(model, name, False))


def enable_activation_checkpointing(model: torch.nn.Module, checkpoint_kwargs: Optional[dict] = None) -> None:
    """Turn activation checkpointing on; ``checkpoint_kwargs`` go to ``torch.utils.checkpoint``
    (default ``{"use_reentrant": False}``, what transformers itself defaults to)."""
    checkpoint_kwargs = {"use_reentrant": False} if checkpoint_kwargs is None else checkpoint_kwargs
    if HAS_ACTIVATION_CHECKPOINTING:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpoint_kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs)
