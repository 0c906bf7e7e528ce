"""The plan's memory for packed micro-batches (``rollout.packing``; ``plan/memory.py``
``packed_attention_bytes``): SDPA and eager keep N x N tensors for a packed sequence of N
tokens, flash-attention and flex attention do not; hand-computed, and the saved tensors measured
on a tiny Llama on the CPU (autograd's saved-tensor hooks, fp32)."""
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ibpo_lit.plan import memory
from ibpo_lit.plan.shapes import ModelShape
from plan_fixtures import run_shape

SHAPE = ModelShape(params=1000, active_params=1000, layer_params=100, embed_params=200, head_params=0,
                   largest_tensor=200, layers=8, hidden=16, mlp_width=32, q_width=16, kv_width=8, kv_heads=2,
                   head_dim=4, attention_layers=6, linear_state_elems=0, qk_norm=False, vocab=50, context=None)
ROW = 300  # the longest row's tokens
ACTIVATIONS = "activations (longest micro-batch)"
MASKS = "attention masks (packed, N x N)"


def _transients(attention="sdpa", **run):
    shape = replace(SHAPE, attention=attention)
    settings = dict(micro_batch_size=8, micro_batch_tokens=1000, packing="on", compute_bytes=4)
    return shape, memory.backward_transients(shape, run_shape(**{**settings, **run}), ROW)


def test_packed_sdpa_keeps_a_bool_mask_and_a_float_copy_per_attention_layer():
    shape, parts = _transients()
    # packed: up to the budget's 1000 real tokens (shorter rows fill it), not 3 rows x 300
    assert parts[ACTIVATIONS] == shape.activation_bytes(1000, 4, False)
    assert parts[MASKS] == 1000 ** 2 * (1 + 4 * 6)  # bool mask + fp32 copy in each of 6 attention layers
    _, checkpointed = _transients(checkpointing=True)
    assert checkpointed[MASKS] == 1000 ** 2 * (1 + 4 * 1)  # one layer's copy at a time
    _, bf16 = _transients(compute_bytes=2)
    assert bf16[MASKS] == 1000 ** 2 * (1 + 2 * 6)


def test_packed_eager_keeps_the_softmax_per_head():
    _, parts = _transients("eager")
    assert parts[MASKS] == 1000 ** 2 * 4 * (1 + 4 * 6)  # float mask; 4 heads x 6 layers of N x N


def test_nothing_quadratic_under_flash_or_flex_or_unpacked():
    for attention in ("flash_attention_2", "flex_attention"):
        shape, parts = _transients(attention)
        assert MASKS not in parts and parts[ACTIVATIONS] == shape.activation_bytes(1000, 4, False)
    # auto packs only where the kernel skips the other rows: under SDPA it is the padded path,
    # rows x longest row (3 x 300 within the budget counted padded)
    for packing in ("auto", "off"):
        shape, parts = _transients(packing=packing)
        assert MASKS not in parts and parts[ACTIVATIONS] == shape.activation_bytes(900, 4, False)
    # no budget: micro_batch_size rows of the longest row, packed
    assert _transients(micro_batch_tokens=None)[1][MASKS] == (8 * ROW) ** 2 * (1 + 4 * 6)
    # a row over the budget runs alone
    assert _transients(micro_batch_tokens=100)[1][MASKS] == ROW ** 2 * (1 + 4 * 6)


def _saved_square_bytes(attention: str, tokens: int, layers: int) -> tuple[ModelShape, int]:
    """(the plan's shape of a tiny Llama, the bytes of the N x N tensors its packed forward of
    two rows saves for backward)."""
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=tokens)
    config._attn_implementation = attention
    shape = ModelShape.from_config(config)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    half = tokens // 2
    positions = torch.cat([torch.arange(half), torch.arange(tokens - half)]).unsqueeze(0)
    saved = {}

    def keep(t):
        if t.dim() >= 2 and t.shape[-2:] == (tokens, tokens):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model.model(input_ids=torch.randint(3, 100, (1, tokens)), position_ids=positions, use_cache=False)
    return shape, sum(saved.values())


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_term_matches_what_a_packed_forward_saves(attention):
    tokens, layers = 128, 3
    shape, measured = _saved_square_bytes(attention, tokens, layers)
    assert shape.attention == attention and shape.attention_layers == layers
    plan = memory.packed_attention_bytes(shape, run_shape(packing="on", compute_bytes=4), tokens)
    # what the plan counts beyond the saved tensors: the mask the forward builds once
    mask_once = tokens ** 2 * (1 if attention == "sdpa" else 4)
    assert measured > 0 and plan - mask_once == measured
