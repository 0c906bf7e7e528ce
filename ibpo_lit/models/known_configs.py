"""The architecture of the shipped configs' hub models, for reading without the hub.

``model_config`` (``ibpo_lit.models.loading``) reads a model's ``config.json`` from a local
folder or the Hugging Face cache; a config that names a hub model not downloaded yet (the
paper's Qwen3-32B on a laptop, before renting GPUs) would leave the context check and
``python -m ibpo_lit plan`` with nothing to read. These are the values of those models' own
``config.json`` on the hub (architecture fields only: no weights, nothing that changes with a
release), so both work offline; a downloaded config always wins over this table.
"""
from __future__ import annotations

from typing import Any

# model id -> (model_type, config fields)
KNOWN_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "Qwen/Qwen3-32B": ("qwen3", dict(
        hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
        tie_word_embeddings=False, rope_theta=1_000_000.0)),
    "Qwen/Qwen3-8B": ("qwen3", dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
        tie_word_embeddings=False, rope_theta=1_000_000.0)),
    "Qwen/Qwen2.5-1.5B-Instruct": ("qwen2", dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
        tie_word_embeddings=True, rope_theta=1_000_000.0)),
    "Qwen/Qwen3-Next-80B-A3B-Thinking": ("qwen3_next", dict(
        hidden_size=2048, intermediate_size=5120, num_hidden_layers=48, num_attention_heads=16,
        num_key_value_heads=2, head_dim=256, vocab_size=151936, max_position_embeddings=262144,
        tie_word_embeddings=False, rope_theta=10_000_000.0, partial_rotary_factor=0.25,
        full_attention_interval=4, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        num_experts=512, num_experts_per_tok=10, decoder_sparse_step=1, norm_topk_prob=True,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4)),
}


def known_config(name: str):
    """The ``PretrainedConfig`` of a model in `KNOWN_CONFIGS`, or None."""
    if name not in KNOWN_CONFIGS:
        return None
    from transformers import AutoConfig

    model_type, fields = KNOWN_CONFIGS[name]
    return AutoConfig.for_model(model_type, **fields)
