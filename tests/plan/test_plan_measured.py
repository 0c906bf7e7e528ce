"""The plan's arithmetic against what the code really holds, where a CPU can measure it:

* activations: the bytes autograd saves for backward (its saved-tensor hooks, each storage once)
  in a forward of Qwen3 and Llama shapes (SmolLM2's, Qwen3-0.6B's, the tiny models'), float32
  and bfloat16, with and without gradient checkpointing: within 15% of
  `ModelShape.activation_bytes`;
* the sharded training state (parameters, gradients, AdamW's moments) each of 2 FSDP2
  processes holds after a real step: within 5% of `memory.trainer_state` (FSDP2 pads each
  tensor's first dimension to a multiple of the processes);
* the KV cache per token: the key/value tensors a real forward caches, exactly.
"""
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ibpo_lit.models.tiny import tiny_config
from ibpo_lit.plan import memory
from ibpo_lit.plan.shapes import ModelShape
from plan_fixtures import run_shape

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

SHAPES = {  # config.json values; fewer layers than the real models (the bytes are per layer)
    "smollm2-135m (llama)": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=3,
                                            num_attention_heads=9, num_key_value_heads=3, vocab_size=2048)),
    "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=16,
                                 num_key_value_heads=8, head_dim=128, vocab_size=2048)),
}


def _config(name):
    if name.startswith("tiny-"):
        return tiny_config(name.removeprefix("tiny-"))
    model_type, fields = SHAPES[name]
    return AutoConfig.for_model(model_type, attn_implementation="sdpa", **fields)


def _saved_bytes(model, tokens: int, checkpointing: bool) -> int:
    """Bytes autograd keeps for backward in one forward (each storage once)."""
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids, use_cache=False)
    return sum(storages.values())


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama", *SHAPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_bytes_match_what_autograd_saves(name, dtype, checkpointing):
    config = _config(name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    shape = ModelShape.from_config(config)
    width = 2 if dtype == torch.bfloat16 else 4
    # per token: the difference of two lengths (what does not grow with the length is no activation)
    measured = (_saved_bytes(model, 192, checkpointing) - _saved_bytes(model, 64, checkpointing)) / 128
    planned = shape.activation_bytes(1, width, checkpointing)
    if checkpointing:  # the plan adds one layer recomputed in backward; a forward keeps the inputs only
        planned -= shape.layer_activation_bytes(width)
    assert measured == pytest.approx(planned, rel=0.15), (measured, planned)


def test_sharded_state_per_process_matches_the_plan(tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "scale"))
    from fit_runs import two_process_results

    ranks = two_process_results(HERE / "plan_state_check.py", tmp_path)
    shape = ModelShape.from_config(tiny_config("qwen3"))
    planned = memory.trainer_state(shape, run_shape(processes=2, sharded=True, param_bytes=4), with_grads=True)
    for rank in ranks:
        assert rank["parameters"] == pytest.approx(planned["parameters"], rel=0.05)
        assert rank["gradients"] == pytest.approx(planned["gradients"], rel=0.05)
        assert rank["optimizer"] == pytest.approx(planned["optimizer (AdamW)"], rel=0.05)
    # and not a split that merely averages right: the two halves make the whole
    assert sum(r["parameters"] for r in ranks) == pytest.approx(shape.params * 4, rel=0.02)


def test_one_process_holds_the_whole_state():
    shape = ModelShape.from_config(tiny_config("qwen3"))
    model = AutoModelForCausalLM.from_config(tiny_config("qwen3"))
    parts = memory.trainer_state(shape, run_shape(processes=1, sharded=False, param_bytes=4), with_grads=True)
    assert parts["parameters"] == sum(p.numel() * 4 for p in model.parameters())
    assert parts["optimizer (AdamW)"] == 2 * parts["parameters"] and parts["gradients"] == parts["parameters"]


@pytest.mark.parametrize("name", ["tiny-qwen3", "qwen3-0.6b"])
def test_kv_cache_bytes_per_token_are_what_a_forward_caches(name):
    config = _config(name)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(0, config.vocab_size, (1, 10)), use_cache=True).past_key_values
    cached = sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
                 for layer in cache.layers)
    shape = ModelShape.from_config(config)
    assert cached / 10 == shape.kv_bytes_per_token(1, 2)
    # tensor parallelism splits the heads; past the head count each GPU keeps one
    for tp in (2, 4 * shape.kv_heads):
        assert shape.kv_bytes_per_token(tp, 2) == cached / 10 / min(tp, shape.kv_heads)
