import pytest
import torch

from ibpo_lit.algorithms import aggregate

LOSS = torch.tensor([[1.0, 2, 3], [4, 5, 6]])
MASK = torch.tensor([[True, True, False], [True, False, False]])


def test_hand_derived_modes():
    # token-mean: (1+2+4)/3 = 7/3
    # seq-mean-token-mean: ((1+2)/2 + 4/1)/2 = (1.5+4)/2 = 2.75
    # seq-mean-token-sum: ((1+2) + 4)/2 = 3.5
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(7 / 3)
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(2.75)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(3.5)


def test_global_denominators():
    # num_seqs=4: 5.5/4 = 1.375 and 7/4 = 1.75; num_tokens=7: 7/7 = 1
    assert aggregate(LOSS, MASK, "seq-mean-token-mean", num_seqs=4).item() == pytest.approx(1.375)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum", num_seqs=4).item() == pytest.approx(1.75)
    assert aggregate(LOSS, MASK, "token-mean", num_tokens=7).item() == pytest.approx(1.0)
    # num_tokens does not affect the sequence modes, nor num_seqs the token mode
    assert aggregate(LOSS, MASK, "token-mean", num_seqs=100).item() == pytest.approx(7 / 3)


def test_float_mask_and_padding_values():
    # weights [.5, 1] on row 0 only: token-mean (.5*1 + 1*2)/1.5 = 5/3
    # seq-mean-token-mean: row 0 2.5/1.5, row 1 len 0 -> 0; /2 -> 5/6
    w = torch.tensor([[0.5, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert aggregate(LOSS, w, "token-mean").item() == pytest.approx(5 / 3)
    assert aggregate(LOSS, w, "seq-mean-token-mean").item() == pytest.approx(5 / 6)
    # NaN / inf on padding never leaks
    dirty = LOSS.clone()
    dirty[0, 2], dirty[1, 1] = float("nan"), float("inf")
    assert aggregate(dirty, MASK, "token-mean").item() == pytest.approx(7 / 3)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_all_padding_gives_zero(mode):
    out = aggregate(LOSS, torch.zeros_like(MASK), mode)
    assert out.item() == 0.0


def _loop(loss, mask, mode):
    rows = []
    total, count = 0.0, 0.0
    for lrow, mrow in zip(loss.tolist(), mask.tolist()):
        s = sum(l * m for l, m in zip(lrow, mrow))
        n = sum(mrow)
        total, count = total + s, count + n
        rows.append(s / max(n, 1) if mode == "seq-mean-token-mean" else s)
    if mode == "token-mean":
        return total / count
    return sum(rows) / len(rows)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_matches_loop(seed, mode):
    gen = torch.Generator().manual_seed(seed)
    loss = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    lengths = torch.randint(0, 8, (5,), generator=gen)
    lengths[0] = 3  # at least one token
    mask = torch.arange(7)[None, :] < lengths[:, None]
    assert aggregate(loss, mask, mode).item() == pytest.approx(_loop(loss, mask.double(), mode))


def test_bad_mode_and_shapes():
    with pytest.raises(ValueError, match="valid: seq-mean-token-mean, seq-mean-token-sum, token-mean"):
        aggregate(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        aggregate(LOSS, MASK[:, :2], "token-mean")
