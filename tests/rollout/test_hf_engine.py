"""HFRolloutEngine on the tiny model: layout, seeding, log-probs, stopping, filtering,
repetition penalty. The tiny model, its tokenizer, the prompts and the logit bias: conftest.py."""
import math

import pytest
import torch

from ibpo_lit.rollout import HFRolloutEngine, SamplingConfig
from ibpo_lit.rollout import hf as hf_engine

EOS = 2  # <|im_end|>, also the pad id


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


def test_eos_ends_a_row_and_is_kept(model, prompts, logit_bias):
    # Make <|im_end|> likely (p ~ 0.17 per step) so rows stop at different steps.
    with logit_bias(EOS, 3.0):
        batch = engine(model, max_new_tokens=12).generate(prompts, n=6, seeds=range(18))
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


# ------------------------------------------------------------------ repetition penalty
# A hand-built next-token distribution, the same at every step (the LM head's output replaced):
# EOS and token 10 have logit ln 3, token 11 has 0, token 12 has -ln 3, every other token -1e4
# (probability 0 in float32). Prompt 0 holds 10 and 12 but not EOS, 11; it is left-padded with
# EOS ids in a batch with the longer prompt 1, which holds none of them.
FIXED = {EOS: math.log(3), 10: math.log(3), 11: 0.0, 12: -math.log(3)}
PENALTY_PROMPTS = [[10, 12, 20], [30, 31, 32, 33, 34, 35, 36]]


def fixed_logits(model):
    """Hook the LM head to return ``FIXED`` at every position; returns the hook's handle."""
    fixed = torch.full((model.config.vocab_size,), -1e4)
    for token, logit in FIXED.items():
        fixed[token] = logit
    return model.lm_head.register_forward_hook(lambda module, args, out: fixed.expand_as(out).clone())


def by_the_formula(prompt: list[int], seed: int, penalty: float, steps: int) -> tuple[list[int], list[float]]:
    """The tokens the engine must draw for (prompt, seed) under ``penalty``, and their log-probs
    under the unpenalised distribution: a seen token's logit l becomes l / penalty if l > 0 and
    l * penalty otherwise (at penalty 2: ln 3 -> ln 3 / 2, so its odds against token 11 go from
    3 to sqrt(3); -ln 3 -> -2 ln 3, odds 1/3 -> 1/9); the row's k-th uniform of its own generator
    picks the first token whose cumulative probability exceeds it (``_sample_rows``)."""
    generator = torch.Generator().manual_seed(seed)
    order = sorted(FIXED)  # cumulative mass in token-id order, as the engine sums it
    base_total = sum(math.exp(FIXED[t]) for t in order)
    seen, tokens, logps = set(prompt), [], []
    for _ in range(steps):
        logits = {t: (l / penalty if l > 0 else l * penalty) if t in seen else l for t, l in FIXED.items()}
        weights = [math.exp(logits[t]) for t in order]
        u = float(torch.rand(1, generator=generator)) * sum(weights)
        cumulative = 0.0
        for token, weight in zip(order, weights):
            cumulative += weight
            if cumulative > u:
                break
        tokens.append(token)
        logps.append(FIXED[token] - math.log(base_total))
        seen.add(token)
        if token == EOS:
            break
    return tokens, logps


@pytest.mark.parametrize("penalty", [1.0, 2.0, 0.5])
def test_repetition_penalty_draws_by_the_formula_and_returns_the_unpenalised_logp(model, penalty):
    """Every drawn token is the one the formula picks, prompt and response tokens both counting
    as seen, the padding not; the log-probs stay the model's own distribution's (no penalty)."""
    seeds = list(range(40))
    handle = fixed_logits(model)
    try:
        eng = engine(model, max_new_tokens=3, repetition_penalty=penalty)
        batch = eng.generate(PENALTY_PROMPTS, n=20, seeds=seeds)
    finally:
        handle.remove()
    for row, (response, seed) in enumerate(zip(batch.response_lists(), seeds)):
        tokens, logps = by_the_formula(PENALTY_PROMPTS[row // 20], seed, penalty, steps=3)
        assert response == tokens, f"row {row}"
        assert batch.rollout_logp[row, : len(tokens)].tolist() == pytest.approx(logps, abs=1e-5)


def test_repetition_penalty_changes_the_draws(model):
    """The formula test above is not vacuous: at penalty 2 the formula (and so the engine) draws
    differently from penalty 1 for some seeds, and seen tokens fall in share."""
    unpenalised = [by_the_formula(PENALTY_PROMPTS[0], s, 1.0, steps=3)[0] for s in range(40)]
    penalised = [by_the_formula(PENALTY_PROMPTS[0], s, 2.0, steps=3)[0] for s in range(40)]
    assert sum(a != b for a, b in zip(unpenalised, penalised)) >= 5
    seen = {10, 12}
    share = [sum(t in seen for r in rows for t in r) / sum(map(len, rows)) for rows in (unpenalised, penalised)]
    assert share[1] < share[0]


def test_repetition_penalty_is_seeded_and_batch_independent(model, prompts):
    eng = engine(model, max_new_tokens=24, repetition_penalty=1.3)
    alone = eng.generate([prompts[1]], n=1, seeds=[1234])
    mixed = eng.generate(prompts, n=2, seeds=[5, 6, 7, 1234, 8, 9])
    assert mixed.response_lists()[3] == alone.response_lists()[0]
    chunked = HFRolloutEngine(model, [EOS], EOS, eng.sampling, max_batch_size=2)
    again = chunked.generate(prompts, n=2, seeds=[5, 6, 7, 1234, 8, 9])
    assert again.response_lists() == mixed.response_lists()
    plain = engine(model, max_new_tokens=24).generate(prompts, n=2, seeds=[5, 6, 7, 1234, 8, 9])
    assert plain.response_lists() != mixed.response_lists()  # the penalty did act on this model


def test_repetition_penalty_1_is_the_unpenalised_sampling_bit_for_bit(model, prompts, monkeypatch):
    """At 1 (the default) no penalty is built, so decoding runs exactly as without the setting;
    and the penalty's code path at 1 is the identity (x / 1 and x * 1 are exact), so the two
    agree bit for bit, tokens and log-probs."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    assert hf_engine._repetition_penalty(SamplingConfig()) is None
    eng = engine(model, max_new_tokens=16, temperature=0.8, top_p=0.95)
    default = eng.generate(prompts, n=2, seeds=range(6))
    monkeypatch.setattr(hf_engine, "_repetition_penalty", lambda sampling: RepetitionPenaltyLogitsProcessor(1.0))
    through_penalty = eng.generate(prompts, n=2, seeds=range(6))
    assert torch.equal(through_penalty.response_ids, default.response_ids)
    assert torch.equal(through_penalty.rollout_logp, default.rollout_logp)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_repetition_penalty_must_be_a_finite_positive_number(bad):
    with pytest.raises(ValueError, match="sampling.repetition_penalty"):
        SamplingConfig(repetition_penalty=bad)
