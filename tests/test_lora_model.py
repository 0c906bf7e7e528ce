"""The LoRA helpers (ibpo_lit/models/lora.py) on the tiny model: an untouched adapter computes the
base model, the merged weights are peft's own merge (out of place), the reference is the base."""
import copy

import pytest
import torch

from ibpo_lit.models.lora import LoRAConfig, adapter_state, apply_lora, is_lora, merged_weights, reference_of
from ibpo_lit.models.tiny import build_tiny_model
from ibpo_lit.rollout.weights import expected_tensor_names


def _ids():
    return torch.tensor([[1, 5, 9, 13, 4, 7], [1, 3, 3, 8, 2, 6]])


def _perturb_adapters(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def test_a_fresh_adapter_is_the_base_and_only_adapters_train():
    base = build_tiny_model(seed=0)
    expected = base(_ids()).logits
    model = apply_lora(copy.deepcopy(base), LoRAConfig(r=4, alpha=8))
    assert is_lora(model) and not is_lora(base)
    torch.testing.assert_close(model(_ids()).logits, expected)
    trainable = adapter_state(model)
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert sum(p.numel() for n, p in model.named_parameters() if n in trainable) < 0.2 * sum(
        p.numel() for p in base.parameters())


def test_merged_weights_equal_peft_merge_and_leave_the_model_as_it_was():
    model = apply_lora(build_tiny_model(seed=0), LoRAConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    _perturb_adapters(model)
    before = {n: p.clone() for n, p in model.named_parameters()}
    merged = dict(merged_weights(model))
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n  # out of place
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    plain = build_tiny_model(seed=1)
    assert set(merged) == expected_tensor_names(plain)  # what the weight sync sends of a plain model
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, reference[name], msg=name)
    plain.load_state_dict(merged, strict=False)  # a plain model takes them as they are (the sync, export)
    torch.testing.assert_close(plain(_ids()).logits, model(_ids()).logits, atol=1e-5, rtol=1e-5)


def test_the_reference_is_the_base_with_adapters_off():
    base = build_tiny_model(seed=0)
    model = apply_lora(copy.deepcopy(base), LoRAConfig(r=4, alpha=8))
    _perturb_adapters(model)
    assert not torch.allclose(model(_ids()).logits, base(_ids()).logits)
    with reference_of(model) as ref:
        torch.testing.assert_close(ref(_ids()).logits, base(_ids()).logits)
    assert not torch.allclose(model(_ids()).logits, base(_ids()).logits)  # back on after the block


def test_bad_settings():
    for bad in ({"r": 0}, {"alpha": 0}, {"dropout": 1.0}):
        with pytest.raises(ValueError, match="model.lora"):
            LoRAConfig(**bad)


def test_the_weight_sync_sends_the_merged_model_complete():
    from ibpo_lit.rollout.weights import SyncManifest, iter_full_weights

    model = apply_lora(build_tiny_model(seed=0), LoRAConfig(r=4, alpha=8))
    _perturb_adapters(model)
    manifest = SyncManifest()
    sent = dict(iter_full_weights(model, manifest))
    assert not manifest.missing() and manifest.expected == expected_tensor_names(build_tiny_model(seed=0))
    for name, tensor in merged_weights(model):
        assert torch.equal(sent[name], tensor)


def test_a_lora_run_says_how_many_parameters_it_trains(caplog):
    base = build_tiny_model(seed=0)
    with caplog.at_level("INFO"):
        model = apply_lora(copy.deepcopy(base), LoRAConfig(r=4, alpha=8))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in base.parameters()) + trained  # tied weights once, as peft counts
    assert f"LoRA: training {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%)" in caplog.text
