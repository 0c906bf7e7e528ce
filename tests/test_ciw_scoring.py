import math
from collections.abc import Sequence

import pytest
import torch

from ibpo_lit.algorithms import grpo_loss, gspo_loss
from ibpo_lit.algorithms.ciw import (
    CIWConfig,
    ResponseLayout,
    Span,
    layout_response,
    layout_weights,
)
from ibpo_lit.algorithms.logprobs import token_logprobs
from ibpo_lit.models.tiny import build_tiny_model, build_tiny_tokenizer
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.ciw_scorer import (
    CIWScorer,
    _copies,
    _needs_pass,
    content_length,
    mask_token_id,
    span_drops_batched,
    token_pieces,
)

PROMPTS = ["Q: 2+3, doubled?\nA: ", "Q: 4*5+1?\nA: "]
RESPONSES = [  # (prompt index, response text)
    (0, "We add 2 + 3 = 5 first. Then we double it to get ten. So it is 10.\n#### 10"),
    (0, "We add 2 + 3 = 5 first. Then we double it to get ten. So it is 10.\n#### 10"),  # duplicate
    (0, "No marker in this one. Just some words here."),
    (1, "Compute 4 * 5 = 20 now. Then add one more to get it.\nFinal answer: 21"),
    (1, "Short.\n\\boxed{21}"),  # one span: "Short." (6 tokens; the lone "\n" is too short)
]


@torch.no_grad()
def span_drops_loop(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    contents: Sequence[list[int]],
    layouts: Sequence[ResponseLayout],
    mask_id: int,
    *,
    temperature: float = 1.0,
) -> list[list[float]]:
    """The slow reference ``span_drops_batched`` is checked against: one unpadded sequence per
    forward pass, all logits, the answer log-prob summed token by token."""
    device = next(model.parameters()).device
    drops: list[list[float]] = [[] for _ in layouts]
    for b, layout in enumerate(layouts):
        if not _needs_pass(layout):
            continue
        p = len(prompts[b])

        def answer_logp(seq: list[int]) -> float:
            ids = torch.tensor([seq], device=device)
            logits = model(input_ids=ids, use_cache=False).logits[0]
            total = 0.0
            for t in range(p + layout.answer_start, p + layout.length):
                total += float(token_logprobs(logits[t - 1], ids[0, t], temperature))
            return total

        copies = _copies(list(prompts[b]), list(contents[b][: layout.length]), layout, mask_id)
        full = answer_logp(copies[0])
        drops[b] = [full - answer_logp(copy) for copy in copies[1:]]
    return drops


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The tiny model's forward takes ~1 ms on one thread but can take ~0.4 s with intra-op
    # threads fighting other processes for a small shared CPU.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0).eval()


def _batch(tokenizer, responses=RESPONSES) -> RolloutBatch:
    pad = tokenizer.pad_token_id
    prompts = [tokenizer(PROMPTS[p], add_special_tokens=False).input_ids for p, _ in responses]
    outs = [tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for _, text in responses]
    lp, lr = max(map(len, prompts)), max(map(len, outs)) + 2  # two columns of padding
    prompt_ids = torch.tensor([[pad] * (lp - len(p)) + p for p in prompts])
    response_ids = torch.tensor([o + [pad] * (lr - len(o)) for o in outs])
    b = len(responses)
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=torch.tensor([[False] * (lp - len(p)) + [True] * len(p) for p in prompts]),
        response_ids=response_ids,
        response_mask=torch.tensor([[True] * len(o) + [False] * (lr - len(o)) for o in outs]),
        rollout_logp=torch.zeros(b, lr),
        group_index=torch.tensor([p for p, _ in responses]),
        seeds=torch.arange(b),
        finished=torch.ones(b, dtype=torch.bool),
    )


def _inputs(tokenizer, batch, cfg):
    stop = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    prompts = batch.prompt_lists()
    contents = [r[: content_length(r, stop)] for r in batch.response_lists()]
    layouts = [layout_response(token_pieces(tokenizer, c), cfg) for c in contents]
    return prompts, contents, layouts


def test_token_pieces_char_level(tokenizer):
    ids = tokenizer("a 2+3=5.\n#### 5", add_special_tokens=False).input_ids
    assert token_pieces(tokenizer, ids) == list("a 2+3=5.\n#### 5")
    assert content_length(ids + [2, 2], {2}) == len(ids)
    assert mask_token_id(tokenizer, CIWConfig()) == tokenizer.pad_token_id == 2


def test_layouts_of_the_example(tokenizer):
    cfg = CIWConfig()
    _, contents, layouts = _inputs(tokenizer, _batch(tokenizer), cfg)
    text = RESPONSES[0][1]
    assert layouts[0].length == len(text)  # the closing EOS is not content
    assert layouts[0].answer_start == text.index("####")
    assert [text[s.start : s.end] for s in layouts[0].spans] == [
        "2 + 3 = 5",
        " Then we double it to get ten.",
        " So it is 10.",
    ]
    assert layouts[2].answer_start is None and layouts[2].spans == ()
    assert layouts[4].answer_start == len("Short.\n") and layouts[4].spans == (Span(0, 6, "sentence"),)


@pytest.mark.parametrize("tokens_per_pass", [1, 100_000])  # one response a pass / all in one
def test_batched_drops_equal_the_one_span_loop(tokenizer, model, tokens_per_pass):
    cfg = CIWConfig()
    prompts, contents, layouts = _inputs(tokenizer, _batch(tokenizer), cfg)
    mask_id = mask_token_id(tokenizer, cfg)
    batched, stats = span_drops_batched(model, prompts, contents, layouts, mask_id, tokens_per_pass=tokens_per_pass)
    loop = span_drops_loop(model, prompts, contents, layouts, mask_id)
    assert [len(d) for d in batched] == [len(l.spans) for l in layouts] == [3, 3, 0, 2, 1]
    for b_row, l_row in zip(batched, loop):
        assert b_row == pytest.approx(l_row, abs=1e-4)
    assert any(abs(d) > 1e-3 for row in loop for d in row)  # the drops are not trivially 0
    # rows 0, 1, 3, 4 need passes (row 2 has no marker)
    assert stats["passes"] == (4 if tokens_per_pass == 1 else 1)
    copies = [1 + len(l.spans) for l in layouts]
    lengths = [len(p) + l.length for p, l in zip(prompts, layouts)]
    assert stats["tokens"] == sum(c * n for c, n, l in zip(copies, lengths, layouts) if l.spans)


def test_temperature_is_applied(tokenizer, model):
    cfg = CIWConfig()
    prompts, contents, layouts = _inputs(tokenizer, _batch(tokenizer), cfg)
    mask_id = mask_token_id(tokenizer, cfg)
    hot, _ = span_drops_batched(model, prompts, contents, layouts, mask_id, temperature=0.7)
    loop = span_drops_loop(model, prompts, contents, layouts, mask_id, temperature=0.7)
    cold, _ = span_drops_batched(model, prompts, contents, layouts, mask_id)
    assert hot[0] == pytest.approx(loop[0], abs=1e-4)
    assert hot[0] != pytest.approx(cold[0], abs=1e-4)


def test_scorer_weights_match_the_loop_reference(tokenizer, model):
    cfg = CIWConfig()
    batch = _batch(tokenizer)
    result = CIWScorer(cfg, tokenizer)(model, batch, step=3)
    prompts, contents, layouts = _inputs(tokenizer, batch, cfg)
    loop = span_drops_loop(model, prompts, contents, layouts, mask_token_id(tokenizer, cfg))
    expected = layout_weights(layouts, loop, batch.response_ids.shape[1], cfg)
    assert result.weights.shape == batch.response_ids.shape and result.weights.dtype == torch.float32
    torch.testing.assert_close(result.weights, expected, atol=1e-4, rtol=0)
    # identical responses get identical weights; the no-marker row is all ones
    torch.testing.assert_close(result.weights[0], result.weights[1])
    torch.testing.assert_close(result.weights[2], torch.ones(batch.response_ids.shape[1]))
    # EOS and padding of every row keep weight 1
    eos_and_pad = ~batch.response_mask
    for row, length in enumerate(layouts):
        eos_and_pad[row, length.length] = True
    assert (result.weights[eos_and_pad] == 1).all()

    m = result.metrics
    assert m["ciw/spans_per_rollout"] == pytest.approx((3 + 3 + 0 + 2 + 1) / 5)
    assert m["ciw/marker_frac"] == pytest.approx(4 / 5)
    drops = [d for row in loop for d in row]
    assert m["ciw/distractor_frac"] == pytest.approx(sum(d < 0 for d in drops) / len(drops))
    assert m["ciw/weight_answer"] == pytest.approx(1.5)
    assert 0.5 <= m["ciw/weight_reasoning"] <= 2.0
    assert m["ciw/overhead_s"] > 0 and m["ciw/rows_scored"] == 5


def test_cache_hits(tokenizer, model):
    cfg = CIWConfig()
    batch = _batch(tokenizer)
    scorer = CIWScorer(cfg, tokenizer)
    first = scorer(model, batch, step=0)
    # row 1 repeats row 0 (same prompt, same response): scored once
    assert first.metrics["ciw/cache_hits"] == 1
    assert first.metrics["ciw/forward_passes"] == 1  # rows 0, 3, 4 share one pass
    again = scorer(model, batch, step=0)
    assert again.metrics["ciw/cache_hits"] == 5 and again.metrics["ciw/forward_passes"] == 0
    assert again.metrics["ciw/forward_tokens"] == 0
    torch.testing.assert_close(again.weights, first.weights)
    # a new policy version invalidates the cache
    later = scorer(model, batch, step=1)
    assert later.metrics["ciw/cache_hits"] == 1 and later.metrics["ciw/forward_passes"] == 1
    # the same response to another prompt is a different key
    other = _batch(tokenizer, [(0, RESPONSES[0][1]), (1, RESPONSES[0][1])])
    assert scorer(model, other, step=1).metrics["ciw/cache_hits"] == 1  # (0, r0) was cached
    no_cache = CIWScorer(CIWConfig(cache_size=0), tokenizer)
    no_cache(model, batch)
    assert no_cache(model, batch).metrics["ciw/forward_passes"] == 1


def test_unselected_and_no_marker_rows_get_ones(tokenizer, model):
    batch = _batch(tokenizer)
    rows = torch.tensor([False, False, True, True, False])
    result = CIWScorer(CIWConfig(), tokenizer)(model, batch, rows=rows)
    ones = torch.ones(batch.response_ids.shape[1])
    for r in (0, 1, 2, 4):  # not selected (0, 1, 4) or without a marker (2)
        torch.testing.assert_close(result.weights[r], ones)
    assert not torch.equal(result.weights[3], ones)
    assert result.layouts[0] is None and result.drops[0] == []
    assert result.metrics["ciw/rows_scored"] == 2
    empty = CIWScorer(CIWConfig(), tokenizer)(model, batch, rows=torch.zeros(5, dtype=torch.bool))
    torch.testing.assert_close(empty.weights, torch.ones_like(empty.weights))
    assert math.isnan(empty.metrics["ciw/spans_per_rollout"])


def test_ablations_through_the_scorer(tokenizer, model):
    batch = _batch(tokenizer)
    ciw = CIWScorer(CIWConfig(), tokenizer)(model, batch)
    uniform = CIWScorer(CIWConfig(mode="uniform"), tokenizer)(model, batch)
    torch.testing.assert_close(uniform.weights, torch.ones_like(uniform.weights))
    assert uniform.metrics["ciw/forward_passes"] == 1  # same scoring cost as ciw
    flat = lambda drops: [d for row in drops for d in row]  # noqa: E731
    assert flat(uniform.drops) == pytest.approx(flat(ciw.drops))
    inverted = CIWScorer(CIWConfig(mode="inverted"), tokenizer)(model, batch)
    # on reasoning tokens that are not formatting: w = 0.5 + 1.5 * i and i_inv = 1.5 - i, so
    # w + w_inv = 2 * 0.5 + 1.5 * 1.5 = 3.25; the answer keeps 1.5
    layout = ciw.layouts[0]
    plain = [t for t in range(layout.answer_start) if not layout.formatting[t]]
    torch.testing.assert_close(ciw.weights[0, plain] + inverted.weights[0, plain], torch.full((len(plain),), 3.25))
    assert not torch.equal(ciw.weights[0, plain], inverted.weights[0, plain])
    answer = slice(layout.answer_start, layout.length)
    torch.testing.assert_close(inverted.weights[0, answer], ciw.weights[0, answer])
    r1 = CIWScorer(CIWConfig(mode="random"), tokenizer)(model, batch, step=1)
    r1_again = CIWScorer(CIWConfig(mode="random"), tokenizer)(model, batch, step=1)
    r2 = CIWScorer(CIWConfig(mode="random"), tokenizer)(model, batch, step=2)
    torch.testing.assert_close(r1.weights, r1_again.weights)  # seeded by (seed, step)
    assert not torch.equal(r1.weights, r2.weights)


def test_weights_plug_into_the_losses(tokenizer, model):
    batch = _batch(tokenizer)
    weights = CIWScorer(CIWConfig(conservation=True), tokenizer)(model, batch).weights
    means = (weights * batch.response_mask).sum(-1) / batch.response_mask.sum(-1)
    torch.testing.assert_close(means, torch.ones(len(batch)))  # conservation: mean 1 per row
    logp = torch.full(batch.response_ids.shape, -1.0, requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0, 0.5, -0.5])
    for loss_fn in (gspo_loss, grpo_loss):
        loss, _ = loss_fn(logp, logp.detach(), adv, batch.response_mask, token_weights=weights)
        assert torch.isfinite(loss)


def test_token_pieces_bpe():
    from transformers import AutoTokenizer

    from ibpo_lit.models.smollm2 import fetch_smollm2

    tok = AutoTokenizer.from_pretrained(fetch_smollm2())  # fetched once per machine (tests/rewards/untrusted_tokenizers.py)
    cfg = CIWConfig()
    text = "We get 12 × 3 = 36 for 数学. Then we add one more, for sure.\nThe final answer is \\boxed{37}."
    ids = tok(text, add_special_tokens=False).input_ids
    pieces = token_pieces(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == text
    assert "" in pieces  # a CJK character split over byte tokens: incremental path
    layout = layout_response(pieces, cfg)
    assert "".join(pieces[layout.answer_start :]).lstrip().startswith("final answer")
    spans = ["".join(pieces[s.start : s.end]) for s in layout.spans]
    assert spans == ["12 × 3 = 36", " Then we add one more, for sure."]  # " " is its own token
