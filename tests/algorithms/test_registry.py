import pytest

from ibpo_lit.algorithms import (
    ADVANTAGE_SCALES,
    AGGREGATIONS,
    POLICY_LOSSES,
    SHAPING_VARIANTS,
    Registry,
    get_policy_loss,
    grpo_loss,
    gspo_loss,
)


def test_names_of_every_registry():
    assert POLICY_LOSSES.names() == ["grpo", "gspo"]
    assert ADVANTAGE_SCALES.names() == ["batch", "group", "none"]
    assert SHAPING_VARIANTS.names() == ["mask", "none", "plain", "ratio"]
    assert AGGREGATIONS.names() == ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean"]


def test_get_returns_the_registered_function():
    assert POLICY_LOSSES.get("gspo") is gspo_loss
    assert get_policy_loss("grpo") is grpo_loss
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
