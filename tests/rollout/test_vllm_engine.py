"""VLLMRolloutEngine on the tiny model, for real (vLLM's CPU build in CI): layout, seeding,
log-probs against the trainer's, stopping, and weight sync that changes generations."""
import copy

import pytest
import torch

from ibpo_lit.rollout import SamplingConfig
from ibpo_lit.rollout.weights import iter_full_weights
from ibpo_lit.training.logprobs import response_logprobs

EOS = 2


def prompts_of(tokenizer):
    texts = ["hi", "what is 12 + 30?", "a much longer prompt, so the others get left padding"]
    chats = [[{"role": "user", "content": t}] for t in texts]
    return [tokenizer.apply_chat_template(c, add_generation_prompt=True)["input_ids"] for c in chats]


def trainer_logp(model, batch):
    model.eval()
    with torch.no_grad():
        return response_logprobs(model, batch, temperature=1.0)


def mismatch(model, batch):
    mask = batch.response_mask
    return float(((trainer_logp(model, batch) - batch.rollout_logp).abs() * mask).sum() / mask.sum())


@pytest.fixture
def synced(tiny_vllm):
    """The shared engine holding the tiny model's original weights again after each test."""
    engine, model, tokenizer = tiny_vllm
    yield engine, model, tokenizer
    engine.sync_weights(iter_full_weights(model))


def test_layout_and_seeds(synced):
    engine, model, tokenizer = synced
    prompts = prompts_of(tokenizer)
    batch = engine.generate(prompts, n=2, seeds=range(6))
    assert len(batch) == 6
    assert batch.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert batch.prompt_lists() == [p for p in prompts for _ in range(2)]
    mask = batch.response_mask
    assert torch.equal(mask, mask.cumprod(dim=1).bool())  # right-padded
    assert (batch.response_ids[~mask] == EOS).all() and (batch.rollout_logp[~mask] == 0).all()
    # a row ends with EOS (kept) exactly when it is finished; else it ran to max_new_tokens
    for row, finished in zip(batch.response_lists(), batch.finished.tolist()):
        assert (row[-1] == EOS) == finished
        assert finished or len(row) == 16
    # the same (prompt, seed) gives the same response, whatever else is in the batch
    alone = engine.generate([prompts[1]], n=1, seeds=[3])
    assert alone.response_lists()[0] == batch.response_lists()[3]
    other = engine.generate([prompts[1]], n=1, seeds=[99])
    assert other.response_lists()[0] != batch.response_lists()[3]


def test_logprobs_match_the_trainer(synced):
    engine, model, tokenizer = synced
    batch = engine.generate(prompts_of(tokenizer), n=4, seeds=range(12))
    assert mismatch(model, batch) < 1e-4  # fp32 engine and trainer: same numbers to ~1e-7


def test_temperature_is_in_the_logprobs(synced):
    engine, model, tokenizer = synced
    batch = engine.generate(prompts_of(tokenizer), n=2, seeds=range(6), sampling=SamplingConfig(temperature=0.7, max_new_tokens=8))
    model.eval()
    with torch.no_grad():
        expected = response_logprobs(model, batch, temperature=0.7)
    mask = batch.response_mask
    assert torch.allclose(expected[mask], batch.rollout_logp[mask], atol=1e-4)


def test_weight_sync_changes_generations_and_restores_them(synced):
    engine, model, tokenizer = synced
    prompts = prompts_of(tokenizer)
    before = engine.generate(prompts, n=2, seeds=range(6)).response_lists()

    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.2)
    stale = engine.generate(prompts, n=2, seeds=range(6))
    assert stale.response_lists() == before  # nothing synced yet
    assert mismatch(changed, stale) > 0.05  # ... which the mismatch shows

    engine.sync_weights(iter_full_weights(changed))
    after = engine.generate(prompts, n=2, seeds=range(6))
    assert after.response_lists() != before
    # every tensor arrived, the tied LM head included: the engine is the changed model
    assert mismatch(changed, after) < 1e-4
    assert engine.last_sync_seconds > 0

    engine.sync_weights(iter_full_weights(model))
    assert engine.generate(prompts, n=2, seeds=range(6)).response_lists() == before


def test_a_step_longer_than_the_schedulers_token_budget(synced):
    # 80 prompts of 200 tokens, more than one scheduler step can prefill: with chunked prefill
    # vLLM's CPU build failed ("CPU Generator does not use offset") on seeded requests.
    engine, _, _ = synced
    prompts = [[1] + [5 + (i * 7 + j) % 90 for j in range(199)] for i in range(80)]
    batch = engine.generate(prompts, n=2, seeds=range(160))
    assert len(batch) == 160 and int(batch.response_mask.sum()) > 0
    alone = engine.generate(prompts[-1:], n=2, seeds=[158, 159])
    assert alone.response_lists() == batch.response_lists()[-2:]
