"""HFRolloutEngine on the tiny model: layout, seeding, log-probs, stopping, filtering."""
import pytest
import torch

from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer
from ibpo_lit.rollout import HFRolloutEngine, SamplingConfig

EOS = 2  # <|im_end|>, also the pad id


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    texts = ["hi", "what is 12 + 30?", "a much longer prompt, so the others get left padding"]
    chats = [[{"role": "user", "content": t}] for t in texts]
    encoded = [tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in chats]
    return [e["input_ids"] for e in encoded]


def engine(model, max_new_tokens=16, eos=(EOS,), **sampling):
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, **sampling)
    return HFRolloutEngine(model, list(eos), EOS, sampling)


def teacher_forced_logp(model, batch, temperature):
    """log softmax(logits / T) of each response token, one unpadded row at a time, no cache."""
    out = torch.zeros_like(batch.rollout_logp)
    with torch.no_grad():
        for row, (prompt, response) in enumerate(zip(batch.prompt_lists(), batch.response_lists())):
            ids = torch.tensor([prompt + response])
            logits = model(ids).logits[0, len(prompt) - 1 : -1]  # predicts each response token
            logp = torch.log_softmax(logits / temperature, dim=-1)
            out[row, : len(response)] = logp.gather(-1, torch.tensor(response)[:, None])[:, 0]
    return out


def test_layout_masks_and_padding(model, prompts):
    batch = engine(model, max_new_tokens=12).generate(prompts, n=2, seeds=range(6))
    assert len(batch) == 6
    assert batch.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert batch.seeds.tolist() == list(range(6))
    assert batch.prompt_lists() == [p for p in prompts for _ in range(2)]
    assert batch.prompt_ids.shape[1] == max(map(len, prompts))
    assert batch.response_ids.shape[1] <= 12
    for name in ("response_ids", "response_mask", "rollout_logp"):
        assert getattr(batch, name).shape == batch.response_ids.shape
    assert batch.rollout_logp.dtype == torch.float32 and not batch.rollout_logp.requires_grad
    # responses are right-padded: the mask is a prefix of ones, then pad ids and 0 log-probs
    mask = batch.response_mask
    assert torch.equal(mask, mask.cumprod(dim=1).bool())
    assert (batch.response_ids[~mask] == EOS).all()
    assert (batch.rollout_logp[~mask] == 0).all()
    assert (batch.rollout_logp[mask] < 0).all()
    assert (batch.prompt_ids[~batch.prompt_mask] == EOS).all()


def test_same_seed_same_response_whatever_the_batch(model, prompts):
    eng = engine(model, max_new_tokens=24)
    alone = eng.generate([prompts[1]], n=1, seeds=[1234])
    # the same (prompt, seed) as row 3 of a batch with longer and shorter prompts around it
    mixed = eng.generate(prompts, n=2, seeds=[5, 6, 7, 1234, 8, 9])
    assert mixed.response_lists()[3] == alone.response_lists()[0]
    width = int(alone.response_lengths[0])
    assert torch.allclose(mixed.rollout_logp[3, :width], alone.rollout_logp[0], atol=1e-5)
    # and again when decoded in chunks of 2 rows
    chunked = HFRolloutEngine(model, [EOS], EOS, eng.sampling, max_batch_size=2)
    again = chunked.generate(prompts, n=2, seeds=[5, 6, 7, 1234, 8, 9])
    assert again.response_lists() == mixed.response_lists()
    assert again.group_index.tolist() == mixed.group_index.tolist()


def test_different_seeds_give_different_responses(model, prompts):
    batch = engine(model).generate([prompts[0]], n=4, seeds=[0, 1, 2, 3])
    responses = [tuple(r) for r in batch.response_lists()]
    assert len(set(responses)) == 4


@pytest.mark.parametrize(
    "sampling",
    [
        dict(temperature=1.0),
        dict(temperature=0.7, top_k=20, top_p=0.9),
        dict(temperature=1.3, min_p=0.05),
    ],
)
def test_rollout_logp_matches_teacher_forcing(model, prompts, sampling):
    batch = engine(model, max_new_tokens=20, **sampling).generate(prompts, n=2, seeds=range(6))
    expected = teacher_forced_logp(model, batch, sampling["temperature"])
    mask = batch.response_mask
    assert (batch.rollout_logp[mask] - expected[mask]).abs().max() < 1e-4


def test_top_k_restricts_samples_to_the_k_best(model, prompts):
    batch = engine(model, max_new_tokens=20, top_k=3).generate(prompts, n=2, seeds=range(6))
    with torch.no_grad():
        for prompt, response in zip(batch.prompt_lists(), batch.response_lists()):
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
            top3 = logits.topk(3, dim=-1).indices
            assert (top3 == torch.tensor(response)[:, None]).any(dim=1).all()


def test_top_k_1_is_greedy(model, prompts):
    batch = engine(model, max_new_tokens=10, top_k=1).generate(prompts, n=2, seeds=range(6))
    with torch.no_grad():
        for p, prompt in enumerate(prompts):
            ids = list(prompt)
            for _ in range(10):  # argmax decoding without a cache
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
                if ids[-1] == EOS:
                    break
            greedy = ids[len(prompt) :]
            assert batch.response_lists()[2 * p] == greedy
            assert batch.response_lists()[2 * p + 1] == greedy  # seed does not matter


def test_eos_ends_a_row_and_is_kept(model, prompts):
    # Make <|im_end|> likely (p ~ 0.17 per step) so rows stop at different steps.
    bias = torch.zeros(model.config.vocab_size)
    bias[EOS] = 3.0
    handle = model.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    try:
        batch = engine(model, max_new_tokens=12).generate(prompts, n=6, seeds=range(18))
    finally:
        handle.remove()
    lengths = batch.response_lengths
    assert batch.finished.any() and not batch.finished.all()
    for row, response in enumerate(batch.response_lists()):
        assert EOS not in response[:-1]
        assert (response[-1] == EOS) == bool(batch.finished[row])
        if not batch.finished[row]:
            assert lengths[row] == 12  # cut at max_new_tokens
    assert batch.response_ids.shape[1] == int(lengths.max())


def test_any_of_several_eos_ids_stops(model, prompts, tokenizer):
    stops = tokenizer.convert_tokens_to_ids(list("abcdefghijklmnopqrstuvwxyz0123456789 "))
    batch = engine(model, max_new_tokens=30, eos=stops).generate(prompts, n=4, seeds=range(12))
    for row, response in enumerate(batch.response_lists()):
        assert not set(response[:-1]) & set(stops)
        assert (response[-1] in stops) == bool(batch.finished[row])


def test_max_new_tokens_and_per_call_override(model, prompts):
    eng = engine(model, max_new_tokens=16)
    assert eng.generate(prompts, n=1, seeds=[0, 1, 2]).response_ids.shape[1] <= 16
    short = eng.generate(prompts, n=1, seeds=[0, 1, 2], sampling=SamplingConfig(max_new_tokens=3))
    assert short.response_ids.shape[1] == 3
    long = eng.generate(prompts, n=1, seeds=[0, 1, 2])
    for a, b in zip(short.response_lists(), long.response_lists()):
        assert a == b[: len(a)]  # same seeds: a shorter budget cuts the same responses


@pytest.mark.parametrize("training", [True, False])
def test_training_flag_restored(model, prompts, training):
    model.train(training)
    engine(model, max_new_tokens=2).generate(prompts[:1], n=1, seeds=[0])
    assert model.training is training
    assert all(m.training is training for m in model.modules())
    model.eval()


def test_rejects_wrong_number_of_seeds(model, prompts):
    with pytest.raises(ValueError, match="one seed per response"):
        engine(model).generate(prompts, n=2, seeds=[0, 1])
