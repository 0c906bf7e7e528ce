import pytest
import torch

from ibpo_lit.algorithms import ibpo_delta, shape_rewards, validate_shaping

NAN = float("nan")


def test_ibpo_delta_cases():
    assert ibpo_delta(0, 1, False) == 0.5  # wrong, corrected, no rewrite -> beta
    assert ibpo_delta(0.0, 1.0, False, "mask", beta=0.3) == 0.3
    assert ibpo_delta(0, 1, False, "ratio", kept_fraction=0.25) == 0.25
    assert ibpo_delta(0, 1, False, "none") == 0.0
    assert ibpo_delta(1, 1, False) == 0.0  # already correct
    assert ibpo_delta(0, 0, False) == 0.0  # correction failed: no penalty
    assert ibpo_delta(0, 1, True) == 0.0  # full rewrite
    assert ibpo_delta(None, 1, False) == 0.0 and ibpo_delta(NAN, 1, False) == 0.0
    assert ibpo_delta(0, None, False) == 0.0 and ibpo_delta(0, NAN, False) == 0.0
    assert ibpo_delta(1, 1, False, "ratio") == 0.0  # kept_fraction only needed when it applies
    with pytest.raises(ValueError, match="kept_fraction"):
        ibpo_delta(0, 1, False, "ratio")
    with pytest.raises(ValueError, match="valid: mask, none, plain, ratio"):
        ibpo_delta(0, 1, False, "plian")


def _hand_inputs():
    rewards = torch.tensor([0.0, 0.0, 1.0, NAN, 0.0])
    corr = torch.tensor([1.0, 1.0, 1.0, 1.0, NAN])
    rewrite = torch.tensor([False, True, False, False, False])
    lengths = torch.tensor([4, 2, 3, 2, 1])
    response_mask = torch.arange(5)[None, :] < lengths[:, None]
    kept = torch.tensor([[1, 0, 1, 1, 1]] * 5, dtype=torch.bool)  # column 4 is padding everywhere
    return rewards, corr, rewrite, kept, response_mask


def test_plain_hand_derived():
    # only row 0 meets the condition (row 1 rewrite, row 2 correct, row 3 NaN, row 4 no correction)
    # delta = [.5, 0, 0, 0, 0]; shaped = r + .6 * delta = [.3, 0, 1, nan, 0]
    out = shape_rewards(*_hand_inputs(), variant="plain", lam=0.6, beta=0.5)
    torch.testing.assert_close(out.delta, torch.tensor([0.5, 0, 0, 0, 0]))
    torch.testing.assert_close(out.shaped_rewards, torch.tensor([0.3, 0, 1, NAN, 0]), equal_nan=True)
    assert out.token_weights is None


def test_ratio_hand_derived():
    # row 0 keeps positions 0, 2, 3 of 4 (padding column 4 does not count): |U|/T = 3/4
    # shaped[0] = 0 + .6 * .75 = .45
    out = shape_rewards(*_hand_inputs(), variant="ratio", lam=0.6)
    torch.testing.assert_close(out.delta, torch.tensor([0.75, 0, 0, 0, 0]))
    assert out.shaped_rewards[0].item() == pytest.approx(0.45)


def test_mask_hand_derived():
    # row 0 (delta .5 > 0): weights = ~kept & response = [0, 1, 0, 0, 0]; other rows all 1
    out = shape_rewards(*_hand_inputs(), variant="mask", lam=0.6, beta=0.5)
    expected = torch.ones(5, 5)
    expected[0] = torch.tensor([0.0, 1, 0, 0, 0])
    torch.testing.assert_close(out.token_weights, expected)
    assert out.shaped_rewards[0].item() == pytest.approx(0.3)


def test_none_variant_changes_nothing():
    rewards, *rest = _hand_inputs()
    out = shape_rewards(rewards, *rest, variant="none")
    torch.testing.assert_close(out.shaped_rewards, rewards, equal_nan=True)
    assert torch.equal(out.delta, torch.zeros(5))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("variant", ["none", "plain", "ratio", "mask"])
def test_vectorised_matches_ibpo_delta_loop(seed, variant):
    gen = torch.Generator().manual_seed(seed)
    b, t = 30, 8
    rewards = torch.randint(0, 2, (b,), generator=gen).float()
    rewards[torch.rand(b, generator=gen) < 0.15] = NAN
    corr = torch.randint(0, 2, (b,), generator=gen).float()
    corr[torch.rand(b, generator=gen) < 0.3] = NAN
    rewrite = torch.rand(b, generator=gen) < 0.3
    response_mask = torch.arange(t)[None, :] < torch.randint(0, t + 1, (b, 1), generator=gen)
    kept = torch.rand(b, t, generator=gen) < 0.6
    rewards[:3], corr[:3], rewrite[:3] = 0.0, 1.0, False  # make sure the condition is met
    lam, beta = 0.6, 0.4
    out = shape_rewards(rewards, corr, rewrite, kept, response_mask, variant, lam, beta)

    deltas, shaped, weights = [], [], torch.ones(b, t)
    for i in range(b):
        n = int(response_mask[i].sum())
        kept_i = [bool(kept[i, j]) for j in range(n)]
        kf = sum(kept_i) / max(n, 1)
        d = ibpo_delta(rewards[i].item(), corr[i].item(), bool(rewrite[i]), variant, beta, kf)
        deltas.append(d)
        shaped.append(rewards[i].item() + lam * d)
        if variant == "mask" and d > 0:
            weights[i] = torch.tensor([float(not k) for k in kept_i] + [0.0] * (t - n))
    torch.testing.assert_close(out.delta, torch.tensor(deltas))
    torch.testing.assert_close(out.shaped_rewards, torch.tensor(shaped), equal_nan=True)
    if variant == "mask":
        torch.testing.assert_close(out.token_weights, weights)


def test_validate_shaping():
    validate_shaping("plain", 0.6, 0.5)  # .3 < 1
    validate_shaping("ratio", 0.99, 0.5)  # max delta 1 -> .99 < 1
    validate_shaping("none", 100.0, 0.5)  # delta 0
    with pytest.raises(ValueError, match="lam=2.0 and beta=0.5"):
        validate_shaping("plain", 2.0, 0.5)  # 2 * .5 = 1, not < 1
    with pytest.raises(ValueError, match="beta=4"):
        validate_shaping("mask", 0.6, 4)  # 2.4
    with pytest.raises(ValueError, match="lam=1.0"):
        validate_shaping("ratio", 1.0, 0.1)  # 1 * 1
    with pytest.raises(ValueError, match="lam must be >= 0"):
        validate_shaping("plain", -0.1, 0.5)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        validate_shaping("plain", 0.6, -0.5)
    with pytest.raises(ValueError, match="lam"):
        shape_rewards(*_hand_inputs(), variant="plain", lam=3.0)
