"""response_logprobs' fast path (shared prompts, length buckets) against the plain per-row
forward: the same log-probs and the same gradient, on the tiny model."""
import pytest
import torch

from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer
from ibpo_lit.rollout import HFRolloutEngine, SamplingConfig
from ibpo_lit.training.logprobs import (
    _length_buckets,
    _per_row_logprobs,
    response_logprobs,
)

EOS = 2


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def batch(model):
    """3 prompts of different lengths x 4 samples, responses of 2 to 20 tokens."""
    tokenizer = build_tiny_tokenizer()
    texts = ["hi", "what is 12 + 30?", "a much longer prompt, so the others get left padding"]
    # tokenize=False then encode: transformers 4 returns a list from a tokenizing
    # apply_chat_template and 5 a BatchEncoding; the text is the same in both.
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
             for t in texts]
    prompts = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in chats]
    bias = torch.zeros(model.config.vocab_size)
    bias[EOS] = 2.5  # EOS likely enough that lengths spread out
    handle = model.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    try:
        return HFRolloutEngine(model, [EOS], EOS, SamplingConfig(max_new_tokens=20)).generate(prompts, n=4, seeds=range(12))
    finally:
        handle.remove()


def logp_and_grads(model, fn, batch, temperature=0.8):
    model.train()
    model.zero_grad(set_to_none=True)
    logp = fn(model, batch, temperature)
    mask = batch.response_mask
    # a loss that weighs every position differently, so a misplaced log-prob shows in the gradient
    weights = torch.linspace(0.5, 1.5, mask.numel()).view_as(logp)
    ((logp * weights * mask).sum() + 0.1 * (logp * mask).pow(2).sum()).backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


def test_lengths_spread_and_prompts_repeat(batch):
    lengths = batch.response_lengths
    assert lengths.min() < 8 and lengths.max() == 20  # otherwise the buckets test nothing
    assert len(_length_buckets(lengths, overhead_tokens=4)) > 1


def test_same_logprobs_and_gradient_as_the_per_row_forward(model, batch):
    expected, expected_grads = logp_and_grads(model, _per_row_logprobs, batch)
    got, grads = logp_and_grads(model, response_logprobs, batch)
    mask = batch.response_mask
    assert got.shape == expected.shape
    assert (got - expected)[mask].abs().max() < 1e-5
    for g, e in zip(grads, expected_grads):
        assert torch.allclose(g, e, rtol=1e-4, atol=1e-6)


def test_no_grad_forward_and_a_single_row(model, batch):
    with torch.no_grad():
        expected = _per_row_logprobs(model, batch, 1.0)
        assert (response_logprobs(model, batch, 1.0) - expected)[batch.response_mask].abs().max() < 1e-5
        one = batch.select([5])
        assert torch.allclose(response_logprobs(model, one, 1.0), _per_row_logprobs(model, one, 1.0))


@pytest.mark.parametrize("overhead", [0, 4, 10_000])
def test_buckets_cover_every_row_once_in_length_order(overhead):
    lengths = torch.tensor([5, 128, 3, 3, 90, 128, 17, 60])
    buckets = _length_buckets(lengths, overhead_tokens=overhead)
    rows = torch.cat(buckets)
    assert sorted(rows.tolist()) == list(range(8))
    assert lengths[rows].tolist() == sorted(lengths.tolist())
    if overhead == 0:  # no cost per bucket: no padding at all
        assert all(len(set(lengths[b].tolist())) == 1 for b in buckets)
    if overhead == 10_000:
        assert len(buckets) == 1


def test_buckets_minimise_padding_plus_overhead():
    # sorted lengths 2, 2, 10, 10: two buckets cost 2*2 + 2*10 + 2*3 = 30; one costs 4*10 + 3 = 43
    assert [b.tolist() for b in _length_buckets(torch.tensor([10, 2, 10, 2]), overhead_tokens=3)] == [[1, 3], [0, 2]]


@pytest.mark.parametrize("single_pass", [False, True])
@pytest.mark.parametrize("chunk_tokens", [1, 7, 10_000])
def test_chunked_head_gives_the_full_logits_result(model, batch, single_pass, chunk_tokens):
    """The LM head in chunks (recomputed in backward): the same log-probs and gradient."""
    expected, expected_grads = logp_and_grads(model, _per_row_logprobs, batch)

    def chunked(m, b, t):
        return response_logprobs(m, b, t, single_pass=single_pass, chunk_tokens=chunk_tokens)

    got, grads = logp_and_grads(model, chunked, batch)
    mask = batch.response_mask
    assert (got - expected)[mask].abs().max() < 1e-5
    for g, e in zip(grads, expected_grads):
        assert torch.allclose(g, e, rtol=1e-4, atol=1e-6)
    assert "forward" not in model.lm_head.__dict__  # the head is itself again afterwards


def test_chunks_bound_the_logits_that_exist_at_once(model, batch):
    """With chunks of 8 positions the head never sees more than 8 rows of hidden states."""
    seen = []
    original = torch.nn.Linear.forward

    def spy(self, x):
        if self is model.lm_head:
            seen.append(x.shape[0] if x.dim() == 2 else x.shape[0] * x.shape[1])
        return original(self, x)

    torch.nn.Linear.forward = spy
    try:
        logp_and_grads(model, lambda m, b, t: response_logprobs(m, b, t, single_pass=True, chunk_tokens=8), batch)
    finally:
        torch.nn.Linear.forward = original
    assert seen and max(seen) <= 8
    # forward chunks and their recomputation in backward
    positions = batch.response_ids.numel()
    assert sum(seen) == 2 * positions


def test_models_that_transform_logits_keep_the_full_head():
    from ibpo_lit.training.logprobs import head_is_last

    model = build_tiny_model(seed=0)
    assert head_is_last(model)
    model.config.final_logit_softcapping = 30.0
    assert not head_is_last(model)


@pytest.mark.parametrize("path", ["per_row", "shared", "chunked"])
def test_entropy_comes_from_the_same_forward_and_matches_the_full_logits(model, batch, path):
    from ibpo_lit.algorithms.logprobs import token_entropy
    from ibpo_lit.training.logprobs import response_logprobs_and_entropy

    model.eval()
    ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
    mask = torch.cat([batch.prompt_mask, batch.response_mask], dim=1).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    lp = batch.prompt_ids.shape[1]
    expected = token_entropy(logits[:, lp - 1: lp - 1 + batch.response_ids.shape[1]], 0.8)
    options = {"per_row": {"single_pass": True}, "shared": {}, "chunked": {"chunk_tokens": 7}}[path]
    logp, entropy = response_logprobs_and_entropy(model, batch, 0.8, **options)
    resp = batch.response_mask
    assert (entropy - expected)[resp].abs().max() < 1e-5
    assert (logp - response_logprobs(model, batch, 0.8, **options))[resp].abs().max() < 1e-6
    assert not entropy.requires_grad  # logged only: nothing kept for backward
    model.train()
    _, with_grad = response_logprobs_and_entropy(model, batch, 0.8, entropy_grad=True, **options)
    assert with_grad.requires_grad  # an entropy bonus trains through it
