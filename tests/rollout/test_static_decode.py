"""HFRolloutEngine(decode="static") on the tiny model: the dynamic decode's sampler over a static
cache. Fed the same uniforms, the two decodes draw the same tokens (every sampling setting, rows
ending at different steps, chunks); a row depends only on (prompt, seed, weights); EOS and the
length cut-off end rows as in dynamic; the log-probs are the trainer's on the returned tokens;
the step compiles on the CPU into one graph that later calls reuse; the setting's validation.
The tiny model, its tokenizer, the prompts and the logit bias: conftest.py."""
from pathlib import Path

import pytest
import torch

from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer
from ibpo_lit.rollout import HFRolloutEngine, SamplingConfig
from ibpo_lit.rollout.counter_rng import counter_uniforms, seed_keys

EOS = 2  # <|im_end|>, also the pad id


@pytest.fixture
def likely_eos(logit_bias):
    """<|im_end|> made likely (p ~ 0.17 a step), so rows end at different steps."""
    with logit_bias(EOS, 3.0):
        yield


class CounterUniformsDynamic(HFRolloutEngine):
    """The dynamic decode (growing cache, finished rows leave) drawing the static decode's
    uniforms: row b's at step t is ``counter_uniforms`` of (seeds[b], t)."""

    def generate(self, prompts, n, seeds, sampling=None):
        self._keys = seed_keys(list(seeds))
        return super().generate(prompts, n, seeds, sampling)

    def _generate_rows(self, prompts, seeds, sampling):
        self._chunk_keys = seed_keys(seeds)
        return super()._generate_rows(prompts, seeds, sampling)

    def _dynamic_uniforms(self, generators, active, step):
        return counter_uniforms(self._chunk_keys[active], step)


def static(model, max_new_tokens=16, eos=(EOS,), tokenizer=None, max_batch_size=None, **sampling):
    return HFRolloutEngine(model, list(eos), EOS, SamplingConfig(max_new_tokens=max_new_tokens, **sampling),
                           max_batch_size=max_batch_size, tokenizer=tokenizer, decode="static")


def assert_same_rollouts(a, b, atol=1e-5):
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.finished, b.finished)
    assert torch.equal(a.group_index, b.group_index) and torch.equal(a.seeds, b.seeds)
    assert torch.equal(a.prompt_ids, b.prompt_ids)
    assert (a.rollout_logp - b.rollout_logp).abs().max() <= atol


SETTINGS = {
    "plain": dict(),
    "top_k_top_p": dict(temperature=1.2, top_k=40, top_p=0.95),
    "min_p_penalty": dict(temperature=1.3, min_p=0.05, repetition_penalty=1.3),
    "stop_strings": dict(temperature=1.2, stop=("e", "?")),
}


@pytest.mark.parametrize("max_batch_size", [None, 4])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_static_is_the_dynamic_sampler_fed_the_same_uniforms(model, tokenizer, prompts, likely_eos, setting,
                                                             max_batch_size):
    """Rows end at different steps (EOS, stop strings): the dynamic decode drops them, the static
    one decodes them on unrecorded; with the same uniforms the responses are the same."""
    sampling = SamplingConfig(max_new_tokens=20, **SETTINGS[setting])
    seeds = list(range(100, 109))
    got = HFRolloutEngine(model, [EOS], EOS, sampling, max_batch_size=max_batch_size, tokenizer=tokenizer,
                          decode="static").generate(prompts, n=3, seeds=seeds)
    same_uniforms = CounterUniformsDynamic(model, [EOS], EOS, sampling, max_batch_size=max_batch_size,
                                           tokenizer=tokenizer).generate(prompts, n=3, seeds=seeds)
    assert got.finished.any() and len(set(got.response_lengths.tolist())) >= 3  # rows ended at different steps
    assert_same_rollouts(got, same_uniforms)
    # The uniforms decide: the dynamic decode with its own generators draws other responses.
    own = HFRolloutEngine(model, [EOS], EOS, sampling, max_batch_size=max_batch_size,
                          tokenizer=tokenizer).generate(prompts, n=3, seeds=seeds)
    assert own.response_lists() != got.response_lists()


def test_same_prompt_and_seed_give_the_same_row_in_any_batch(model, prompts):
    eng = static(model, max_new_tokens=24, temperature=0.9, top_p=0.95)
    alone = eng.generate([prompts[1]], n=1, seeds=[1234])
    mixed = eng.generate(prompts, n=2, seeds=[5, 6, 7, 1234, 8, 9])
    assert mixed.response_lists()[3] == alone.response_lists()[0]
    width = int(alone.response_lengths[0])
    assert torch.allclose(mixed.rollout_logp[3, :width], alone.rollout_logp[0], atol=1e-5)
    # another order, and chunks of 2 rows
    swapped = eng.generate(prompts[::-1], n=2, seeds=[8, 9, 1234, 7, 5, 6])
    assert swapped.response_lists()[2] == alone.response_lists()[0]
    chunked = static(model, max_new_tokens=24, temperature=0.9, top_p=0.95, max_batch_size=2)
    again = chunked.generate(prompts, n=2, seeds=[5, 6, 7, 1234, 8, 9])
    assert again.response_lists() == mixed.response_lists()
    assert len({tuple(r) for r in mixed.response_lists()[2:4]}) == 2  # the seed matters


def test_eos_ends_a_row_kept_and_finished_the_cut_off_is_not(model, prompts, likely_eos):
    batch = static(model, max_new_tokens=12).generate(prompts, n=6, seeds=range(18))
    lengths = batch.response_lengths
    assert batch.finished.any() and not batch.finished.all()
    for row, response in enumerate(batch.response_lists()):
        assert EOS not in response[:-1]
        assert (response[-1] == EOS) == bool(batch.finished[row])
        if not batch.finished[row]:
            assert lengths[row] == 12
    assert batch.response_ids.shape[1] == int(lengths.max())
    mask = batch.response_mask
    assert torch.equal(mask, mask.cumprod(dim=1).bool())
    assert (batch.response_ids[~mask] == EOS).all() and (batch.rollout_logp[~mask] == 0).all()


def test_every_row_ending_early_ends_the_call_early(model, prompts, logit_bias):
    """All rows end at their first token: the response is one token wide whatever the budget."""
    with logit_bias(EOS, 100.0):
        batch = static(model, max_new_tokens=40).generate(prompts, n=2, seeds=range(6))
    assert batch.response_lists() == [[EOS]] * 6 and batch.finished.all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logp_is_the_trainers_on_the_returned_tokens(model, prompts, temperature):
    from ibpo_lit.algorithms.logprobs import token_logprobs

    batch = static(model, max_new_tokens=20, temperature=temperature, top_k=30).generate(prompts, n=2, seeds=range(6))
    with torch.no_grad():
        for row, (prompt, response) in enumerate(zip(batch.prompt_lists(), batch.response_lists())):
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
            expected = token_logprobs(logits, torch.tensor(response), temperature=temperature)
            assert torch.allclose(batch.rollout_logp[row, : len(response)], expected, atol=1e-5, rtol=0)


def test_a_shorter_budget_cuts_the_same_responses(model, prompts):
    eng = static(model, max_new_tokens=16)
    short = eng.generate(prompts, n=1, seeds=[0, 1, 2], sampling=SamplingConfig(max_new_tokens=3))
    long = eng.generate(prompts, n=1, seeds=[0, 1, 2])
    assert short.response_ids.shape[1] == 3
    for a, b in zip(short.response_lists(), long.response_lists()):
        assert a == b[: len(a)]


def test_no_prompts_and_the_training_flag(model):
    model.train()
    eng = static(model, max_new_tokens=2)
    assert len(eng.generate([], n=2, seeds=[])) == 0
    eng.generate([[5, 6]], n=1, seeds=[0])
    assert model.training
    model.eval()


def test_compiled_step_on_the_cpu_is_one_graph_with_the_eager_steps_results(prompts):
    """``compile_step=True`` on the CPU: the step (forward over the static cache, log-prob,
    sampling) compiles into one graph with no break, inside ``generate``'s eager stance and
    through decoder layers that training compiled; a second call of the same shapes compiles
    nothing; tokens equal the eager static decode's, log-probs to float tolerance."""
    from torch._dynamo.utils import counters

    from ibpo_lit.models.compile import compile_decoder_layers

    torch._dynamo.reset()
    model = build_tiny_model(seed=1)
    compile_decoder_layers(model)  # as model.torch_compile does for training
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.8, top_p=0.9, repetition_penalty=1.2)
    eager = HFRolloutEngine(model, [EOS], EOS, sampling, decode="static", compile_step=False)
    compiled = HFRolloutEngine(model, [EOS], EOS, sampling, decode="static", compile_step=True)
    # dynamo's counters are the process's (reset() does not clear them): count from here
    graphs_before, breaks_before = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    try:
        expected = eager.generate(prompts, n=2, seeds=range(6))
        assert counters["stats"]["unique_graphs"] == graphs_before  # eager: the trained layers ran uncompiled
        first = compiled.generate(prompts, n=2, seeds=range(6))
        graphs = counters["stats"]["unique_graphs"]
        assert graphs == graphs_before + 1 and sum(counters["graph_break"].values()) == breaks_before
        second = compiled.generate(prompts, n=2, seeds=range(6))
        assert counters["stats"]["unique_graphs"] == graphs
    finally:
        torch._dynamo.reset()
    assert_same_rollouts(first, expected, atol=1e-5)
    assert_same_rollouts(second, expected, atol=1e-5)


def test_decode_settings_are_validated(model):
    from ibpo_lit.config import RolloutConfig
    from ibpo_lit.rollout.factory import build_engine

    with pytest.raises(ValueError, match="decode must be one of dynamic, static, got 'paged'"):
        HFRolloutEngine(model, [EOS], EOS, SamplingConfig(), decode="paged")
    with pytest.raises(ValueError, match="compile_step needs decode='static'"):
        HFRolloutEngine(model, [EOS], EOS, SamplingConfig(), compile_step=True)
    with pytest.raises(ValueError, match="rollout.hf_decode must be one of dynamic, static"):
        RolloutConfig(hf_decode="paged")
    assert RolloutConfig().hf_decode == "dynamic"
    tokenizer = build_tiny_tokenizer()
    assert build_engine(model, tokenizer, SamplingConfig(), "hf").decode == "dynamic"
    assert build_engine(model, tokenizer, SamplingConfig(), "hf", hf_decode="static").decode == "static"


def test_a_sliding_window_model_is_refused():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=128, head_dim=32, use_sliding_window=True,
                         sliding_window=4, max_window_layers=0, layer_types=["sliding_attention"] * 2)
    model = Qwen3ForCausalLM(config).eval()
    with pytest.raises(ValueError, match="full-attention caches only.*StaticSlidingWindowLayer.*decode='dynamic'"):
        HFRolloutEngine(model, [EOS], EOS, SamplingConfig(max_new_tokens=4), decode="static").generate(
            [[5, 6, 7]], n=1, seeds=[0])


def test_a_fit_with_the_static_decode_trains_and_its_setting_is_checked(tmp_path):
    """What a user runs: `fit` with rollout.hf_decode: static on the tiny config; the run's engine
    decodes static, steps train, and the setting is refused with another backend."""
    import sys

    from ibpo_lit.__main__ import main
    from ibpo_lit.config import RolloutConfig

    with pytest.raises(ValueError, match="rollout.hf_decode: static is the HF engine's decode, but rollout.backend is vllm"):
        RolloutConfig(backend="vllm", hf_decode="static")
    sys.argv = sys.argv[:1]
    tiny = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")
    cli = main(["fit", "--config", tiny, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path),
                "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
                "--model.rollout.hf_decode", "static"])
    assert cli.trainer.global_step == 2
    assert cli.model.engine.decode == "static"
