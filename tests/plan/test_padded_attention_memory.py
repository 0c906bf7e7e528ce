"""The plan's memory for padded micro-batches (``rollout.packing`` off; ``plan/memory.py``
``padded_attention_bytes``): SDPA keeps rows x L x L tensors where a micro-batch has padding and
none without, eager whatever the padding; flash-attention and flex attention none;
hand-computed, and measured on a tiny Llama on the CPU through the update's own per-row forward
(``training/logprobs.py``, left-padded prompts, right-padded responses; autograd's saved-tensor
hooks, fp32)."""
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ibpo_lit.plan import memory
from ibpo_lit.plan.shapes import ModelShape
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.logprobs import response_logprobs
from plan_fixtures import run_shape

SHAPE = ModelShape(params=1000, active_params=1000, layer_params=100, embed_params=200, head_params=0,
                   largest_tensor=200, layers=8, hidden=16, mlp_width=32, q_width=16, kv_width=8, kv_heads=2,
                   head_dim=4, attention_layers=6, linear_state_elems=0, qk_norm=False, vocab=50, context=None)
ROW = 300  # the longest row's tokens
PADDED = memory.PADDED_MASKS
PACKED = "attention masks (packed, N x N)"


def _transients(attention="sdpa", **run):
    shape = replace(SHAPE, attention=attention)
    settings = dict(micro_batch_size=3, micro_batch_tokens=None, packing="off", compute_bytes=4)
    return memory.backward_transients(shape, run_shape(**{**settings, **run}), ROW)


def test_padded_sdpa_keeps_a_bool_mask_and_a_float_copy_per_attention_layer():
    # 3 rows of up to 300 tokens: 3 x 300 x 300 entries; bool mask + fp32 copy in each of 6 layers
    assert _transients()[PADDED] == 3 * 300 ** 2 * (1 + 4 * 6)
    assert _transients(checkpointing=True)[PADDED] == 3 * 300 ** 2 * (1 + 4 * 1)  # one layer's copy at a time
    assert _transients(compute_bytes=2)[PADDED] == 3 * 300 ** 2 * (1 + 2 * 6)
    # a token budget of 700 fits 2 longest rows
    assert _transients(micro_batch_tokens=700)[PADDED] == 2 * 300 ** 2 * (1 + 4 * 6)


def test_one_row_has_no_padding_under_sdpa():
    for run in (dict(micro_batch_size=1), dict(micro_batch_tokens=400)):  # one row per micro-batch
        assert PADDED not in _transients(**run)


def test_padded_eager_keeps_the_softmax_per_head_whatever_the_padding():
    assert _transients("eager")[PADDED] == 3 * 300 ** 2 * 4 * (1 + 4 * 6)  # float mask; 4 heads x 6 layers
    assert _transients("eager", micro_batch_size=1)[PADDED] == 300 ** 2 * 4 * (1 + 4 * 6)


def test_nothing_padded_under_flash_or_flex_or_packed():
    for attention in ("flash_attention_2", "flex_attention"):
        assert PADDED not in _transients(attention)
    packed = _transients(packing="on")  # the packed term instead, over 3 x 300 tokens
    assert PADDED not in packed and packed[PACKED] == 900 ** 2 * (1 + 4 * 6)


def _measured(attention: str, prompts: list[int], responses: list[int], checkpointing: bool, layers: int = 2):
    """(the plan's shape of a tiny Llama, the rows x L x L masks its attention layers are handed
    (bytes of each distinct one), and the bytes of the rows x L x L tensors autograd saves in the
    update's per-row forward of rows of these prompt and response lengths)."""
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config._attn_implementation = attention
    shape = ModelShape.from_config(config)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = [torch.randint(3, 100, (n,)).tolist() for n in prompts + responses]
    batch = RolloutBatch.from_lists(ids[:len(prompts)], ids[len(prompts):], [[0.0] * n for n in responses],
                                    [True] * len(responses), list(range(len(responses))),
                                    list(range(len(responses))), pad_token_id=0)
    width = max(prompts) + max(responses)  # L: the forward sees prompt + response, trimmed
    square = lambda t: t is not None and t.dim() == 4 and t.shape[-2:] == (width, width)  # noqa: E731
    masks, saved = {}, {}

    def handed(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if square(mask):
            masks[mask.untyped_storage().data_ptr()] = mask.untyped_storage().nbytes()

    def keep(t):
        if square(t):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    hooks = [layer.self_attn.register_forward_pre_hook(handed, with_kwargs=True) for layer in model.model.layers]
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        response_logprobs(model, batch, single_pass=True).sum().backward()
    for hook in hooks:
        hook.remove()
    return shape, sum(masks.values()), sum(saved.values())


PADDED_ROWS = ([12, 12, 12], [36, 20, 5])  # right-padded responses: L = 48
LEFT_PADDED_ROWS = ([12, 7, 3], [36, 36, 36])  # left-padded prompts only
EQUAL_ROWS = ([12, 12, 12], [36, 36, 36])  # no padding
ONE_ROW = ([12], [36])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("rows", [PADDED_ROWS, LEFT_PADDED_ROWS, EQUAL_ROWS, ONE_ROW],
                         ids=["padded", "left-padded", "equal", "one-row"])
def test_the_term_matches_what_a_padded_forward_builds_and_saves(attention, rows):
    prompts, responses = rows
    count, width = len(responses), max(prompts) + max(responses)
    shape, mask, saved = _measured(attention, prompts, responses, checkpointing=False)
    plan = memory.padded_attention_bytes(shape, run_shape(packing="off", compute_bytes=4), count, width)
    # the plan assumes padding for any micro-batch of two rows: exact where there is padding
    if attention == "sdpa" and rows is EQUAL_ROWS:
        assert (mask, saved) == (0, 0) and plan == count * width ** 2 * (1 + 4 * shape.attention_layers)
        return
    if attention == "sdpa" and rows is ONE_ROW:
        assert (mask, saved) == (0, 0) and plan == 0  # transformers skips the mask: SDPA runs causal
        return
    assert mask == count * width ** 2 * (1 if attention == "sdpa" else 4)  # [R, 1, L, L], built once
    assert saved > 0 and plan == mask + saved
    # with recomputation the forward saves none of them; the recomputed layer saves one layer's
    _, mask_checkpointed, saved_checkpointed = _measured(attention, prompts, responses, checkpointing=True)
    checkpointed = memory.padded_attention_bytes(shape, run_shape(packing="off", compute_bytes=4, checkpointing=True),
                                                 count, width)
    assert (mask_checkpointed, saved_checkpointed) == (mask, 0)
    assert checkpointed == mask + saved / shape.attention_layers
