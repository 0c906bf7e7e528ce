import pytest

from ibpo_lit.algorithms import (
    ADVANTAGE_SCALES,
    AGGREGATIONS,
    POLICY_LOSSES,
    SHAPING_VARIANTS,
    LossInputs,
    LossSettings,
    Registry,
    get_policy_loss,
    grpo_loss,
    gspo_loss,
)


def test_names_of_every_registry():
    assert POLICY_LOSSES.names() == ["grpo", "gspo"]
    assert ADVANTAGE_SCALES.names() == ["batch", "group", "none", "reinforce_plus_plus_baseline", "rloo"]
    assert SHAPING_VARIANTS.names() == ["mask", "none", "plain", "ratio"]
    assert AGGREGATIONS.names() == ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean"]


def test_every_loss_takes_the_same_inputs_and_settings():
    import torch

    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=gen)
    logp = old + 0.01 * torch.randn(3, 5, generator=gen)
    adv, mask = torch.tensor([1.0, -1.0, 0.5]), torch.ones(3, 5, dtype=torch.bool)
    settings = LossSettings(eps_low=0.2, eps_high=0.28)
    for name, formula in (("gspo", gspo_loss), ("grpo", grpo_loss)):
        loss, _ = POLICY_LOSSES.get(name)(LossInputs(logp, old, adv, mask), settings)
        direct, _ = formula(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
        assert torch.equal(loss, direct)
    assert get_policy_loss("grpo") is POLICY_LOSSES.get("grpo")
    # The KL needs the reference's log-probs, with any loss: its settings say so, not the loss's name.
    from ibpo_lit.algorithms.regularizers import RegularizerSettings

    assert RegularizerSettings(beta_kl=0.1).needs_ref_logp and not RegularizerSettings().needs_ref_logp
    assert RegularizerSettings(entropy_coef=0.01).needs_every_row and not RegularizerSettings().needs_every_row
    assert "gspo" in POLICY_LOSSES and "ppo" not in POLICY_LOSSES
    assert ["unhashable"] not in POLICY_LOSSES


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        POLICY_LOSSES.get("gspoo")
    assert str(err.value) == "unknown policy loss 'gspoo'; valid: grpo, gspo"
    with pytest.raises(ValueError, match="valid: batch, group, none"):
        ADVANTAGE_SCALES.get("std")


def test_register_decorator_and_duplicates():
    reg = Registry("widget")

    @reg.register("b")
    def b():
        return 2

    reg.register("a")(lambda: 1)
    assert reg.get("b") is b and reg.get("a")() == 1
    assert reg.names() == ["a", "b"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 3)
    with pytest.raises(ValueError, match="unknown widget 'c'; valid: a, b"):
        reg.get("c")


def test_every_shaping_variant_returns_delta_and_token_weights():
    import torch

    changed = torch.tensor([[1.0, 0.0, 1.0]])
    got = {name: SHAPING_VARIANTS.get(name)(0.5, torch.tensor([0.25]), changed) for name in SHAPING_VARIANTS.names()}
    assert {name: (float(torch.as_tensor(d)), w is None) for name, (d, w) in got.items()} == {
        "none": (0.0, True), "plain": (0.5, True), "ratio": (0.25, True), "mask": (0.5, False)}
    assert torch.equal(got["mask"][1], changed)  # only changed tokens get gradient
