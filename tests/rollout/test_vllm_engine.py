"""VLLMRolloutEngine on the tiny model, for real (vLLM's CPU build in CI): layout, seeding,
log-probs against the trainer's, stopping, and weight sync that changes generations."""
import copy

import pytest
import torch

from ibpo_lit.rollout import SamplingConfig
from ibpo_lit.rollout.weights import iter_full_weights
from ibpo_lit.training.logprobs import response_logprobs

pytestmark = pytest.mark.xdist_group("tiny_vllm")  # the session's engine (tests/conftest.py)

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


def penalised_logp(model, batch, penalty, temperature=1.0):
    """log softmax(penalised logits / T) of each response token, one unpadded row at a time: a
    token already in the prompt or the response so far has its logit l divided by ``penalty``
    when l > 0 and multiplied by it otherwise (``SamplingConfig.repetition_penalty``)."""
    out = torch.zeros_like(batch.rollout_logp)
    model.eval()
    with torch.no_grad():
        for row, (prompt, response) in enumerate(zip(batch.prompt_lists(), batch.response_lists())):
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
            for t, token in enumerate(response):
                seen = torch.tensor(sorted(set(prompt + response[:t])))
                step = logits[t].clone()
                step[seen] = torch.where(step[seen] > 0, step[seen] / penalty, step[seen] * penalty)
                out[row, t] = torch.log_softmax(step / temperature, dim=-1)[token]
    return out


def test_repetition_penalty_is_vllms_and_in_its_logprobs(synced):
    """vLLM takes ``repetition_penalty`` and applies the formula ``SamplingConfig`` documents:
    its processed log-probs are the penalised distribution's, token for token (the HF engine's
    would be the unpenalised ones, which these differ from)."""
    engine, model, tokenizer = synced
    sampling = SamplingConfig(temperature=0.8, max_new_tokens=12, repetition_penalty=1.5)
    batch = engine.generate(prompts_of(tokenizer), n=2, seeds=range(6), sampling=sampling)
    mask = batch.response_mask
    expected = penalised_logp(model, batch, 1.5, temperature=0.8)
    assert torch.allclose(expected[mask], batch.rollout_logp[mask], atol=1e-4)
    with torch.no_grad():
        unpenalised = response_logprobs(model, batch, temperature=0.8)
    assert (unpenalised[mask] - batch.rollout_logp[mask]).abs().max() > 1e-2


def test_repetition_penalty_greedy_tokens_equal_the_hf_engines(synced):
    """Greedy (top_k 1) with a penalty: vLLM and the HF engine pick the same tokens, and not the
    ones picked without it. Greedy, the tiny model writes "\\n" 16 times; at penalty 5 the seen
    tokens' logits shrink enough that its choices vary (at 1.5 and 2 they do not)."""
    from ibpo_lit.rollout import HFRolloutEngine

    engine, model, tokenizer = synced
    prompts = prompts_of(tokenizer)
    penalised = SamplingConfig(top_k=1, max_new_tokens=16, repetition_penalty=5.0)
    hf = HFRolloutEngine(model, [EOS], EOS, penalised).generate(prompts, n=1, seeds=range(3))
    ours = engine.generate(prompts, n=1, seeds=range(3), sampling=penalised)
    assert ours.response_lists() == hf.response_lists()
    plain = engine.generate(prompts, n=1, seeds=range(3), sampling=SamplingConfig(top_k=1, max_new_tokens=16))
    assert plain.response_lists() != ours.response_lists()


def test_the_engine_samples_outside_the_trainers_autocast(synced, monkeypatch):
    """A training step runs under Lightning's autocast (bf16-mixed, one device or DDP); vLLM
    must compute in its own dtype there. (vLLM's CPU kernels ignore autocast, so the tokens
    cannot show it here; on a GPU, ``F.linear`` would run in bf16 whatever the engine's dtype.)"""
    engine, _, tokenizer = synced
    seen = []
    real = engine.llm.generate

    def recording(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.llm, "generate", recording)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = engine.generate(prompts_of(tokenizer)[:1], n=2, seeds=[1, 2])
    outside = engine.generate(prompts_of(tokenizer)[:1], n=2, seeds=[1, 2])
    assert seen == [False, False]
    assert torch.equal(inside.response_ids, outside.response_ids)


def test_every_rank_of_a_run_has_its_own_vllm_cache_folder(tmp_path):
    from ibpo_lit.rollout.vllm_engine import rank_cache_root

    assert rank_cache_root({}, rank=0, world=1) is None  # one process: vLLM's own root
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    roots = [rank_cache_root(env, rank=r, world=8) for r in range(8)]
    assert len(set(roots)) == 8  # ranks 0 and 4 (both TP rank 0 at tensor_parallel_size 4) apart
    assert roots[4] == str(tmp_path / "vllm" / "ibpo_lit_rank_4")
    user = {"VLLM_CACHE_ROOT": str(tmp_path / "mine"), "XDG_CACHE_HOME": "/elsewhere"}
    assert rank_cache_root(user, rank=3, world=8) == str(tmp_path / "mine" / "ibpo_lit_rank_3")
    again = {"VLLM_CACHE_ROOT": rank_cache_root(user, rank=3, world=8)}  # an engine built twice
    assert rank_cache_root(again, rank=3, world=8) == again["VLLM_CACHE_ROOT"]


def test_the_reload_route_is_chosen_by_architecture(tiny_vllm, tmp_path):
    """vLLM's checkpoint-format reload corrupts state-space layers (vLLM PR #48284): a model
    whose architecture vLLM declares hybrid is refused that route whatever its files are called
    (a tiny Qwen3-Next saved as "my-model"), and a plain transformer keeps it."""
    from transformers import Qwen3NextConfig
    from vllm.config import ModelConfig

    from ibpo_lit.rollout.vllm_engine import (
        CHECKPOINT_FORMAT_RELOAD,
        PLAIN_LOAD,
        has_state_space_layers,
        reload_route,
    )

    engine, _, _ = tiny_vllm
    assert engine.reload_route == CHECKPOINT_FORMAT_RELOAD
    assert not has_state_space_layers(engine.llm.llm_engine.model_config)

    folder = tmp_path / "my-model"  # nothing in the name says hybrid
    config = Qwen3NextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=32, vocab_size=1000, linear_num_key_heads=2,
                             linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32)
    config.architectures = ["Qwen3NextForCausalLM"]
    config.save_pretrained(folder)
    hybrid = ModelConfig(model=str(folder), skip_tokenizer_init=True)
    assert has_state_space_layers(hybrid)

    assert reload_route(False, None, on_gpu=False) == CHECKPOINT_FORMAT_RELOAD
    assert reload_route(False, "fp8", on_gpu=True) == CHECKPOINT_FORMAT_RELOAD
    assert reload_route(True, None, on_gpu=True) == PLAIN_LOAD
    with pytest.raises(ValueError, match="state-space .* quantised"):
        reload_route(True, "fp8", on_gpu=True)
    with pytest.raises(ValueError, match="backend: hf on the CPU"):
        reload_route(True, None, on_gpu=False)
