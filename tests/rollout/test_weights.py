"""iter_full_weights: every weight once, under its checkpoint name, gathered when sharded."""

from ibpo_lit.models import build_tiny_model
from ibpo_lit.rollout.weights import clean_name, iter_full_weights


def test_plain_model_yields_checkpoint_names_once():
    model = build_tiny_model(seed=0)
    named = list(iter_full_weights(model))
    names = [n for n, _ in named]
    assert len(names) == len(set(names))
    # tied: the LM head is the embedding, sent once under the embedding's name (as saved)
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    params = dict(model.named_parameters())
    assert set(names) == set(params)
    for name, tensor in named:
        assert tensor.data_ptr() == params[name].data_ptr()  # no copy for plain tensors


def test_wrapper_prefixes_are_removed():
    assert clean_name("_fsdp_wrapped_module.model.layers.0._fsdp_wrapped_module.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert clean_name("_orig_mod.model.norm.weight") == "model.norm.weight"
    assert clean_name("model.layers.1._checkpoint_wrapped_module.self_attn.o_proj.weight") == (
        "model.layers.1.self_attn.o_proj.weight"
    )
