import math

import pytest
import torch

from ibpo_lit.algorithms import grpo_loss


def _hand_batch():
    # row 0: A=+1, rho = [1.5, .5, pad]; row 1: A=-1, rho = [.5, 1.5, 1]
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    log_rho = torch.tensor([[1.5, 0.5, 1.0], [0.5, 1.5, 1.0]]).log()
    logp = (old + log_rho).requires_grad_()
    mask = torch.tensor([[True, True, False], [True, True, True]])
    return logp, old, torch.tensor([1.0, -1.0]), mask


def test_hand_derived_modes_and_metrics():
    logp, old, adv, mask = _hand_batch()
    # row 0: min(1.5, 1.2) = 1.2 (clipped), min(.5, .8) = .5 -> token losses [-1.2, -.5]
    # row 1: min(-.5, -.8) = -.8 (clipped), min(-1.5, -1.2) = -1.5, min(-1, -1) = -1
    #        -> token losses [.8, 1.5, 1.0]
    # GRPO: (-1.7/2 + 3.3/3)/2 = (-.85 + 1.1)/2 = .125; DAPO: (-1.7 + 3.3)/5 = .32
    # seq-mean-token-sum: (-1.7 + 3.3)/2 = .8
    loss, m = grpo_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(0.125, abs=1e-6)
    assert grpo_loss(logp, old, adv, mask, agg_mode="token-mean")[0].item() == pytest.approx(0.32, abs=1e-6)
    assert grpo_loss(logp, old, adv, mask, agg_mode="seq-mean-token-sum")[0].item() == pytest.approx(0.8, abs=1e-6)
    assert m["clip_frac"].item() == pytest.approx(2 / 5)  # 2 of 5 valid tokens
    assert m["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 0.5 + 1.5 + 1.0) / 5)
    assert "kl" not in m
    loss.backward()
    # d/dlogp of -A*rho/(|y|*B) on unclipped tokens: row 0 t1: -.5/4 = -.125;
    # row 1 t1: 1.5/6 = .25, t2: 1/6; clipped tokens and padding: 0
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.125, 0.0], [0.0, 0.25, 1 / 6]]))


def test_token_weights_scale_each_token():
    logp, old, adv, mask = _hand_batch()
    w = torch.tensor([[2.0, 0.0, 9.0], [1.0, 1.0, 0.0]])
    # row 0: [-2.4, 0] -> -2.4/2 = -1.2 ; row 1: [.8, 1.5, 0] -> 2.3/3; GRPO: (-1.2 + 2.3/3)/2
    loss, _ = grpo_loss(logp, old, adv, mask, token_weights=w)
    assert loss.item() == pytest.approx((-1.2 + 2.3 / 3) / 2, abs=1e-6)


def _loop_reference(logp, old, adv, mask, eps, w):
    per_seq = []
    for i in range(logp.shape[0]):
        terms = []
        for t in range(logp.shape[1]):
            if mask[i, t]:
                rho = math.exp(logp[i, t] - old[i, t])
                a = adv[i].item()
                terms.append(-w[i, t].item() * min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a))
        per_seq.append(sum(terms) / max(len(terms), 1))
    return sum(per_seq) / len(per_seq)


@pytest.mark.parametrize("seed", range(4))
def test_matches_loop_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(6, 9, generator=gen) * 3
    logp = old + torch.randn(6, 9, generator=gen) * 0.3
    mask = torch.arange(9)[None, :] < torch.randint(0, 10, (6, 1), generator=gen)
    adv = torch.randn(6, generator=gen)
    w = torch.rand(6, 9, generator=gen)
    loss, _ = grpo_loss(logp, old, adv, mask, token_weights=w)
    assert loss.item() == pytest.approx(_loop_reference(logp, old, adv, mask, 0.2, w), abs=1e-6)
