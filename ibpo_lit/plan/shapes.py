"""What a model's architecture costs per token and per GPU: the plan's inputs from the model.

`ModelShape.from_config` builds the model on the meta device (no weights, no memory) from its
Hugging Face config and counts what the plan needs: all parameters and a token's active ones
(`ibpo_lit.models.parameters.active_parameters`), the largest decoder layer (FSDP2's unit),
the embeddings and an untied LM head (their own units), the largest single tensor (the weight
sync gathers one at a time), and the widths that set activation and KV-cache sizes.

Activation bytes are what autograd saves for backward, per token (`layer_activation_bytes`):
a Qwen3/Llama decoder layer with flash-style attention (nothing quadratic in the length) saves
``(4c + 8) h + 4c I + a (q + kv)`` bytes at compute width ``c`` (2 for bf16: the RMSNorms
keep a float32 copy of their inputs, hence the ``+ 8``), where ``a`` is ``2c`` for plain
attention and ``3c + 4`` with Qwen3's query/key norms; measured with autograd's
saved-tensor hooks on CPU models (tests/plan/test_plan_measured.py checks it on other shapes).
With gradient checkpointing only each layer's input stays: ``h c`` bytes a layer. The final
RMSNorm adds ``(c + 4) h``.
Mixture-of-experts layers count ``top_k`` routed experts plus the shared one as their MLP;
linear-attention layers (Qwen3-Next's Gated DeltaNet) count as attention of their own widths.
These are estimates of the same kind as the rest of the plan: within 15% on the measured shapes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class ModelShape:
    """A model's sizes (parameter counts in elements, widths in elements)."""

    params: int
    active_params: int
    layer_params: int  # the largest decoder layer
    embed_params: int
    head_params: int  # 0 when the LM head is tied to the embeddings
    largest_tensor: int
    layers: int
    hidden: int
    mlp_width: int  # per token: I (dense) or top_k * moe_I + shared_I (MoE)
    q_width: int  # attention heads x head_dim
    kv_width: int  # key/value heads x head_dim
    kv_heads: int
    head_dim: int
    attention_layers: int  # layers with a KV cache (all but linear-attention ones)
    linear_state_elems: int  # per sequence: the recurrent state of all linear-attention layers
    qk_norm: bool  # RMSNorm on queries and keys (Qwen3): they keep float32 copies too
    vocab: int
    context: int | None
    attention: str = "sdpa"  # config._attn_implementation; unset: transformers' default, SDPA

    @property
    def heads(self) -> int:
        """Query heads."""
        return self.q_width // max(self.head_dim, 1)

    @classmethod
    def from_config(cls, config: Any, attention: Optional[str] = None) -> "ModelShape":
        """The shape of ``config``'s model; ``attention``: the run's ``model.attn_implementation``
        over the config's own (unset: the config's, else SDPA)."""
        import torch
        from transformers import AutoModelForCausalLM

        from ibpo_lit.models.parameters import active_parameters
        from ibpo_lit.scale.fsdp2 import decoder_layers

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        embed, head = model.get_input_embeddings(), model.get_output_embeddings()
        tied = head is None or head.weight is embed.weight
        layers = decoder_layers(model)
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        layer_types = list(getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers)
        linear = sum(1 for t in layer_types if t == "linear_attention")
        state = 0
        if linear:  # Gated DeltaNet: a (key x value) matrix per value head, and the conv window
            k_dim, v_dim = text.linear_key_head_dim, text.linear_value_head_dim
            conv = 2 * text.linear_num_key_heads * k_dim + text.linear_num_value_heads * v_dim
            state = linear * (text.linear_num_value_heads * k_dim * v_dim + conv * (text.linear_conv_kernel_dim - 1))
        top_k, experts = getattr(text, "num_experts_per_tok", None), getattr(text, "num_experts", None)
        if top_k and experts:
            mlp = top_k * text.moe_intermediate_size + (getattr(text, "shared_expert_intermediate_size", 0) or 0)
        else:
            mlp = text.intermediate_size
        context = getattr(text, "max_position_embeddings", None)
        return cls(
            params=sum(p.numel() for p in model.parameters()),
            active_params=active_parameters(model),
            layer_params=max((sum(p.numel() for p in layer.parameters()) for layer in layers), default=0),
            embed_params=embed.weight.numel(),
            head_params=0 if tied else head.weight.numel(),
            largest_tensor=max(p.numel() for p in model.parameters()),
            layers=len(layers) or text.num_hidden_layers,
            hidden=text.hidden_size,
            mlp_width=mlp,
            q_width=heads * head_dim,
            kv_width=kv_heads * head_dim,
            kv_heads=kv_heads,
            head_dim=head_dim,
            attention_layers=len(layer_types) - linear,
            linear_state_elems=state,
            qk_norm=any(".q_norm." in name for name, _ in model.named_parameters()),
            vocab=text.vocab_size,
            context=context if isinstance(context, int) else None,
            attention=attention or getattr(text, "_attn_implementation", None)
            or getattr(config, "_attn_implementation", None) or "sdpa",
        )

    def layer_activation_bytes(self, compute_bytes: int) -> float:
        """Bytes one decoder layer saves for backward per token (see the module docstring)."""
        c = compute_bytes
        attention = (3 * c + 4) if self.qk_norm else 2 * c
        return (4 * c + 8) * self.hidden + 4 * c * self.mlp_width + attention * (self.q_width + self.kv_width)

    def activation_bytes(self, tokens: int, compute_bytes: int, checkpointing: bool) -> float:
        """Bytes saved for backward by a forward over ``tokens`` tokens: with checkpointing each
        layer's input plus one layer recomputed in backward; without it every layer's."""
        outside = (compute_bytes + 4) * self.hidden  # the final RMSNorm's input and its float32 copy
        if checkpointing:
            layers = self.layers * self.hidden * compute_bytes + self.layer_activation_bytes(compute_bytes)
        else:
            layers = self.layers * self.layer_activation_bytes(compute_bytes)
        return tokens * (layers + outside)

    def kv_bytes_per_token(self, tensor_parallel: int, dtype_bytes: int = 2) -> float:
        """KV cache per token on one GPU of a tensor-parallel engine (vLLM splits the key/value
        heads over the GPUs and replicates them when there are fewer heads than GPUs)."""
        heads_per_gpu = math.ceil(self.kv_heads / tensor_parallel)
        return self.attention_layers * 2 * heads_per_gpu * self.head_dim * dtype_bytes

    def state_bytes_per_sequence(self, tensor_parallel: int, dtype_bytes: int = 2) -> float:
        """Linear-attention state per sequence on one GPU (0 for a pure-attention model)."""
        return self.linear_state_elems * dtype_bytes / tensor_parallel
