"""How many parameters one token's forward pass uses (the ``N`` of FLOPs estimates).

A dense model uses all of them. A mixture of experts routes each token to ``top_k`` of
``num_experts`` experts per layer, so a token uses the shared part (attention, norms, router,
embeddings, any always-on shared expert) and ``top_k / num_experts`` of the expert weights:
Qwen3-Next-80B-A3B uses about 3B of its 80B. Counting all of them would overstate a MoE run's
compute by some 25x and end a FLOP budget that much too early.

Experts are found by name, as transformers names them (``mlp.experts.<i>.*``, packed
``mlp.experts.gate_up_proj``; Mixtral's ``block_sparse_moe.experts.*``); top-k and the
expert count by the config (``num_experts_per_tok``; ``num_experts`` or
``num_local_experts``). ``numel()`` of an FSDP2 DTensor is its global size, so every rank
counts the whole model.

Not covered: models that route by other means (capacity-factor dropping, per-token expert
counts); their experts count as active.
"""
from __future__ import annotations

import torch


def active_parameters(model: torch.nn.Module) -> int:
    """Parameters a token passes through: all of a dense model's; a MoE's shared ones plus
    ``num_experts_per_tok / num_experts`` of its expert weights."""
    config = getattr(model, "config", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    total = expert = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if ".experts." in name:
            expert += p.numel()
    if not top_k or not experts or not expert:
        return total
    return total - expert + round(expert * top_k / experts)
