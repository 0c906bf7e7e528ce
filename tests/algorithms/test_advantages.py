import math

import pytest
import torch

from ibpo_lit.algorithms import group_advantages, grouped_advantages

NAN = float("nan")
SCALES = ("group", "batch", "none", "rloo", "reinforce_plus_plus_baseline")


def test_group_scale_hand_derived():
    # row 0: [1,0,0,1]: mean .5, pop std .5 -> A = +-.5/(.5+1e-8) = +-1
    # row 1: all equal -> 0
    # row 2: [nan,1,0,0]: finite [1,0,0], mean 1/3, var (4/9+1/9+1/9)/3 = 2/9, std .4714
    #        A(1) = (2/3)/.4714 = sqrt(2); A(0) = -(1/3)/.4714 = -1/sqrt(2); A(nan) = 0
    rewards = torch.tensor([[1.0, 0, 0, 1], [1, 1, 1, 1], [NAN, 1, 0, 0]])
    expected = torch.tensor(
        [[1.0, -1, -1, 1], [0, 0, 0, 0], [0, math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)]]
    )
    torch.testing.assert_close(group_advantages(rewards), expected)


def test_none_scale_is_dr_grpo():
    # [1,0,0,1] - .5 = [.5,-.5,-.5,.5]; [3,1] per group of 2: mean 2 -> [1,-1]
    torch.testing.assert_close(
        group_advantages(torch.tensor([[1.0, 0, 0, 1]]), "none"), torch.tensor([[0.5, -0.5, -0.5, 0.5]])
    )
    torch.testing.assert_close(
        group_advantages(torch.tensor([[3.0, 1], [2, 2]]), "none"), torch.tensor([[1.0, -1], [0, 0]])
    )


def test_batch_scale_uses_std_of_all_rewards():
    # all 8 rewards [1,0,0,1,1,1,1,1]: mean .75, var .75*.25 = .1875, std .4330
    # group 0 mean .5 -> A = +-.5/.4330 = +-1.1547; group 1 degenerate -> 0
    rewards = torch.tensor([[1.0, 0, 0, 1], [1, 1, 1, 1]])
    a = 0.5 / math.sqrt(0.1875)
    torch.testing.assert_close(
        group_advantages(rewards, "batch"), torch.tensor([[a, -a, -a, a], [0, 0, 0, 0]])
    )


def test_rloo_is_the_leave_one_out_baseline():
    # [1,0,0,1]: each reward minus the mean of the other three: 1 - 1/3, 0 - 2/3
    # [3,1,NaN]: finite [3,1]: 3 - 1, 1 - 3; the NaN row 0
    rewards = torch.tensor([[1.0, 0, 0, 1], [3, 1, NAN, 5]])
    rewards[1, 3] = NAN
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [2.0, -2, 0, 0]])
    torch.testing.assert_close(group_advantages(rewards, "rloo"), expected)


def test_reinforce_plus_plus_baseline_divides_centred_rewards_by_their_batch_std():
    # centred: group 0 [1,0,0,1] - .5 = [.5,-.5,-.5,.5]; group 1 [1,1,1,0] - .75 = [.25,.25,.25,-.75]
    # population std of the 8 centred values: sqrt((4*.25 + 3*.0625 + .5625) / 8) = sqrt(.21875)
    rewards = torch.tensor([[1.0, 0, 0, 1], [1, 1, 1, 0]])
    std = math.sqrt(0.21875)
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]]) / std
    torch.testing.assert_close(group_advantages(rewards, "reinforce_plus_plus_baseline"), expected)
    # unlike "batch", which divides by the std of the raw rewards (mean .625: sqrt(.234375))
    assert not torch.allclose(group_advantages(rewards, "batch"), expected)


def test_degenerate_groups_are_zero_never_nan():
    rewards = torch.tensor([[NAN, NAN, NAN], [NAN, 1.0, NAN], [0.1, 0.1, 0.1], [0.7, NAN, 0.7]])
    for scale in SCALES:
        out = group_advantages(rewards, scale)
        assert torch.equal(out, torch.zeros(4, 3)), scale  # exactly 0, even for 0.1 rounding


def test_ragged_groups_hand_derived():
    # ids 7: rewards [1,0] -> mean .5, std .5 -> [1,-1]
    # ids 3: rewards [0,1,1] -> mean 2/3, std sqrt(2/9) -> [-sqrt(2), 1/sqrt(2), 1/sqrt(2)]
    rewards = torch.tensor([1.0, 0, 0, 1, 1])
    ids = torch.tensor([7, 3, 7, 3, 3])
    s2 = math.sqrt(2)
    torch.testing.assert_close(
        grouped_advantages(rewards, ids), torch.tensor([1.0, -s2, -1, 1 / s2, 1 / s2])
    )


def _loop_reference(rewards: list[float], ids: list[int], scale: str) -> list[float]:
    finite_all = [r for r in rewards if math.isfinite(r)]
    bmean = sum(finite_all) / max(len(finite_all), 1)
    bstd = math.sqrt(sum((r - bmean) ** 2 for r in finite_all) / max(len(finite_all), 1))
    out = []
    for r, g in zip(rewards, ids):
        members = [x for x, h in zip(rewards, ids) if h == g and math.isfinite(x)]
        if not math.isfinite(r) or len(members) < 2 or max(members) == min(members):
            out.append(0.0)
            continue
        mean = sum(members) / len(members)
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / len(members))
        if scale == "rloo":  # r minus the mean of the others, directly
            out.append(r - (sum(members) - r) / (len(members) - 1))
            continue
        denom = {"group": std + 1e-8, "batch": bstd + 1e-8, "none": 1.0,
                 "reinforce_plus_plus_baseline": _centred_std(rewards, ids) + 1e-8}[scale]
        out.append((r - mean) / denom)
    return out


def _centred_std(rewards: list[float], ids: list[int]) -> float:
    centred = []
    for r, g in zip(rewards, ids):
        if math.isfinite(r):
            members = [x for x, h in zip(rewards, ids) if h == g and math.isfinite(x)]
            centred.append(r - sum(members) / len(members))
    return math.sqrt(sum(c * c for c in centred) / max(len(centred), 1))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("scale", SCALES)
def test_grouped_matches_loop_reference(seed, scale):
    gen = torch.Generator().manual_seed(seed)
    n = 40
    ids = torch.randint(0, 9, (n,), generator=gen) * 5  # sparse ids, ragged groups
    rewards = torch.randint(0, 3, (n,), generator=gen).double() / 2  # {0, .5, 1}: ties
    rewards[torch.rand(n, generator=gen) < 0.2] = NAN
    expected = torch.tensor(_loop_reference(rewards.tolist(), ids.tolist(), scale), dtype=torch.float64)
    torch.testing.assert_close(grouped_advantages(rewards, ids, scale), expected)


@pytest.mark.parametrize("seed", range(3))
def test_dense_equals_ragged(seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(4, 6, generator=gen)
    rewards[rewards < 0.15] = NAN
    ids = torch.arange(4).repeat_interleave(6)
    for scale in SCALES:
        torch.testing.assert_close(
            group_advantages(rewards, scale).flatten(), grouped_advantages(rewards.flatten(), ids, scale)
        )


def test_bad_inputs():
    with pytest.raises(ValueError, match="valid: batch, group, none"):
        group_advantages(torch.zeros(2, 2), "std")
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        group_advantages(torch.zeros(4))
    assert grouped_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)
