"""``model.torch_compile`` (ibpo_lit/models/compile.py): compiled decoder layers give the trainer's
log-probs, entropies and gradients of the eager model (the log-prob head's reduction compiled
too), generation through them stays eager (no compilation,
the same tokens), and a model without decoder layers is refused. Inductor on the CPU, fp32, the
tiny model: one compilation of one shape (~20 s on 2 cores)."""
import copy

import pytest
import torch
from torch._dynamo.utils import counters

from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer
from ibpo_lit.models.compile import compile_decoder_layers, is_compiled
from ibpo_lit.module import IBPOModule
from ibpo_lit.rollout import HFRolloutEngine, SamplingConfig
from ibpo_lit.training import logprobs as logprobs_module
from ibpo_lit.training.logprobs import response_logprobs_and_entropy

EOS = 2


def prompts():
    tokenizer = build_tiny_tokenizer()
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
             for t in ("hi", "what is 12 + 30?")]
    return [tokenizer(c, add_special_tokens=False)["input_ids"] for c in chats]


def generate(model):
    return HFRolloutEngine(model, [EOS], EOS, SamplingConfig(max_new_tokens=12)).generate(prompts(), n=2, seeds=range(4))


def logp_and_grads(model, batch):
    """The trainer's path: one pass per row, the head in chunks of 8 positions (checkpointed),
    log-probs with the entropy's gradient."""
    model.train()
    model.zero_grad(set_to_none=True)
    logp, entropy = response_logprobs_and_entropy(model, batch, 0.8, entropy_grad=True, single_pass=True,
                                                  chunk_tokens=8)
    weights = torch.linspace(0.5, 1.5, logp.numel()).view_as(logp)
    ((logp * weights + 0.1 * entropy) * batch.response_mask).sum().backward()
    return torch.stack([logp, entropy]).detach(), [p.grad.clone() for p in model.parameters()]


def test_compiled_layers_train_like_eager_and_generate_eagerly(monkeypatch):
    torch._dynamo.reset()
    head_calls = []
    compiled_reduce = logprobs_module._compiled_reduce()
    monkeypatch.setattr(logprobs_module, "_compiled_reduce", lambda: head_calls.append(1) or compiled_reduce)
    eager_model = build_tiny_model(seed=0)
    compiled = copy.deepcopy(eager_model)
    assert compile_decoder_layers(compiled) == eager_model.config.num_hidden_layers
    assert is_compiled(compiled) and not is_compiled(eager_model)

    before = counters["frames"]["ok"]
    batch = generate(compiled)  # generation first: nothing compiled yet, so a compile here would show
    assert counters["frames"]["ok"] == before, "generation compiled the layers (the engine must run them eagerly)"
    expected = generate(eager_model)
    assert torch.equal(batch.response_ids, expected.response_ids)

    logp, grads = logp_and_grads(compiled, batch)
    assert counters["frames"]["ok"] > before, "the trainer's forward did not run the compiled layers"
    assert head_calls, "the head's reduction was not the compiled one"
    calls = len(head_calls)
    ref_logp, ref_grads = logp_and_grads(eager_model, batch)
    assert len(head_calls) == calls  # the eager model's head stays eager
    mask = batch.response_mask.bool()
    assert (logp - ref_logp)[:, mask].abs().max() < 1e-5
    for got, want in zip(grads, ref_grads):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def test_a_model_without_decoder_layers_is_refused():
    with pytest.raises(ValueError, match="model.torch_compile: no decoder layers"):
        compile_decoder_layers(torch.nn.Linear(2, 2))


def test_the_setting_compiles_the_policy_it_loads():
    module = IBPOModule(torch_compile=True)
    module.configure_model()
    assert is_compiled(module.policy)
    assert not is_compiled(IBPOModule().policy or build_tiny_model(seed=0))
