"""CIW's counterfactual forwards packed (``rollout.packing``; ``training/ciw_scorer.py``,
``span_drops_batched(packed=True)``): a pass's full and masked copies laid end to end, no
padding, positions restarting per copy. The drops equal the one-sequence-per-forward reference
and the padded passes; each pass is one packed row; the budget counts real tokens; the scorer's
weights are the unpacked scorer's. Tiny Llama, fp32, CPU (SDPA's block-diagonal mask)."""
import pytest
import torch

from ibpo_lit.algorithms.ciw import CIWConfig
from ibpo_lit.models.tiny import build_tiny_model, build_tiny_tokenizer
from ibpo_lit.training.ciw_scorer import CIWScorer, mask_token_id, span_drops_batched
from test_ciw_scoring import _batch, _inputs, span_drops_loop


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0).eval()


def _shapes(model):
    shapes = []
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    return shapes, hook


@pytest.mark.parametrize("tokens_per_pass", [1, 100_000])  # one response a pass / all in one
def test_packed_drops_equal_the_reference_and_the_padded_passes(tokenizer, model, tokens_per_pass):
    cfg = CIWConfig()
    prompts, contents, layouts = _inputs(tokenizer, _batch(tokenizer), cfg)
    mask_id = mask_token_id(tokenizer, cfg)
    shapes, hook = _shapes(model)
    packed, stats = span_drops_batched(model, prompts, contents, layouts, mask_id, tokens_per_pass=tokens_per_pass,
                                       packed=True)
    hook.remove()
    padded, padded_stats = span_drops_batched(model, prompts, contents, layouts, mask_id,
                                              tokens_per_pass=tokens_per_pass)
    loop = span_drops_loop(model, prompts, contents, layouts, mask_id)
    assert [len(d) for d in packed] == [3, 3, 0, 2, 1]
    for p_row, l_row, d_row in zip(packed, loop, padded):
        assert p_row == pytest.approx(l_row, abs=1e-4) and p_row == pytest.approx(d_row, abs=1e-4)
    assert any(abs(d) > 1e-3 for row in loop for d in row)
    assert stats == padded_stats  # the same passes here, and the same real tokens
    # every pass one packed row of its copies' real tokens
    assert all(rows == 1 for rows, _ in shapes) and sum(n for _, n in shapes) == stats["tokens"]
    assert len(shapes) == stats["passes"] == (4 if tokens_per_pass == 1 else 1)


def test_the_packed_budget_counts_real_tokens(tokenizer, model):
    cfg = CIWConfig()
    prompts, contents, layouts = _inputs(tokenizer, _batch(tokenizer), cfg)
    mask_id = mask_token_id(tokenizer, cfg)
    scored = [b for b, layout in enumerate(layouts) if layout.spans]
    real = sum((1 + len(layouts[b].spans)) * (len(prompts[b]) + layouts[b].length) for b in scored)
    # the rows' copies differ in length, so padded to the longest they cost more than their real tokens
    _, padded = span_drops_batched(model, prompts, contents, layouts, mask_id, tokens_per_pass=real)
    _, packed = span_drops_batched(model, prompts, contents, layouts, mask_id, tokens_per_pass=real, packed=True)
    assert padded["passes"] > 1 and packed["passes"] == 1 and packed["tokens"] == real


def test_the_scorer_packed_gives_the_unpacked_weights(tokenizer, model):
    cfg = CIWConfig(cache_size=0)
    batch = _batch(tokenizer)
    packed = CIWScorer(cfg, tokenizer)(model, batch, step=3, packed=True)
    plain = CIWScorer(cfg, tokenizer)(model, batch, step=3)
    torch.testing.assert_close(packed.weights, plain.weights, atol=1e-4, rtol=0)
    assert not torch.equal(plain.weights, torch.ones_like(plain.weights))
    for a, b in zip(packed.drops, plain.drops):
        assert a == pytest.approx(b, abs=1e-4)
