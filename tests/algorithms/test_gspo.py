import math

import pytest
import torch

from ibpo_lit.algorithms import gspo_loss


def _hand_batch():
    # row 0: mask [1,1,0], logp-old = [.2, 0] -> log s = .1, s = e^.1 = 1.10517, A = +1
    # row 1: mask [1,1,1], logp-old = -.3 each -> s = e^-.3 = .740818, A = -2
    old = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]])
    logp = old + torch.tensor([[0.2, 0.0, 5.0], [-0.3, -0.3, -0.3]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    return logp.requires_grad_(), old, torch.tensor([1.0, -2.0]), mask


def test_hand_derived_value_gradient_and_metrics():
    logp, old, adv, mask = _hand_batch()
    loss, m = gspo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    # row 0: s=1.10517 < 1.2 -> J0 = s*A = 1.10517
    # row 1: min(.740818*-2, clip(.740818,.8,1.2)*-2) = min(-1.4816, -1.6) = -1.6 (clipped)
    # loss = -(1.10517 - 1.6)/2 = .247591
    assert loss.item() == pytest.approx(-(math.exp(0.1) - 1.6) / 2, abs=1e-6)
    assert m["clip_frac"].item() == 0.5
    assert m["ratio_mean"].item() == pytest.approx((math.exp(0.1) + math.exp(-0.3)) / 2, abs=1e-6)
    assert m["ratio_max"].item() == pytest.approx(math.exp(0.1), abs=1e-6)
    assert m["ratio_min"].item() == pytest.approx(math.exp(-0.3), abs=1e-6)
    loss.backward()
    # row 0 unclipped: dloss/dlogp_t = -(1/B) * A * s / |y| = -(1/2)*1*1.10517/2 = -.276293
    # row 1 clipped: 0; padding: 0
    g = -math.exp(0.1) / 4
    torch.testing.assert_close(logp.grad, torch.tensor([[g, g, 0.0], [0.0, 0.0, 0.0]]))


def test_token_weights_hand_derived():
    logp, old, adv, mask = _hand_batch()
    w = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    loss, _ = gspo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2, token_weights=w)
    # J0 = (1/2) * (1*s*1 + 0) = .552585; J1 = -1.6 -> loss = -(.552585 - 1.6)/2
    assert loss.item() == pytest.approx(-(math.exp(0.1) / 2 - 1.6) / 2, abs=1e-6)
    loss.backward()
    # only token 0 of row 0 gets gradient: -(1/2) * s / 2
    g = -math.exp(0.1) / 4
    torch.testing.assert_close(logp.grad, torch.tensor([[g, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def _sequence_level_gspo(logp, old, adv, mask, eps_low, eps_high):
    m = mask.float()
    log_s = ((logp - old) * m).sum(-1) / m.sum(-1).clamp_min(1)
    s = log_s.exp()
    j = torch.minimum(s * adv, s.clamp(1 - eps_low, 1 + eps_high) * adv)
    return -(j * mask.any(-1)).sum() / logp.shape[0]  # empty rows contribute 0


def _random_batch(seed, b=8, t=12, noise=0.05):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen) * 3
    # per-row scale: some rows stay inside the clip range, some leave it
    scale = torch.rand(b, 1, generator=gen) * noise
    shift = torch.randn(b, t, generator=gen) * scale
    # rows 0, 1 leave the clip range of the test (3e-3, 4e-3) on the active side, row 2 does not
    shift[0], shift[1], shift[2] = 0.01, -0.01, 0.001
    logp = (old + shift).requires_grad_()
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    lengths[-1] = 0  # an empty row
    mask = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.randn(b, generator=gen)
    adv[0], adv[1], adv[2] = 1.0, -1.0, -0.5  # both signs
    return logp, old, adv, mask, gen


@pytest.mark.parametrize("seed", range(5))
def test_token_level_with_unit_weights_equals_sequence_level(seed):
    logp, old, adv, mask, _ = _random_batch(seed)
    eps_low, eps_high = 3e-3, 4e-3
    loss, metrics = gspo_loss(logp, old, adv, mask, eps_low, eps_high)
    (grad,) = torch.autograd.grad(loss, logp)
    ref = _sequence_level_gspo(logp, old, adv, mask, eps_low, eps_high)
    (ref_grad,) = torch.autograd.grad(ref, logp)
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=1e-7, rtol=1e-5)
    assert 0 < metrics["clip_frac"].item() < 1  # both branches exercised
    row_has_grad = grad.abs().sum(-1) > 0
    assert (~row_has_grad & mask.any(-1)).any() and row_has_grad.any()  # a clipped row: no grad


def _loop_reference(logp, old, adv, mask, w, eps_low, eps_high):
    total = 0.0
    for i in range(logp.shape[0]):
        idx = [t for t in range(logp.shape[1]) if mask[i, t]]
        n = max(len(idx), 1)
        s = math.exp(sum(logp[i, t].item() - old[i, t].item() for t in idx) / n)
        a = adv[i].item()
        term = min(s * a, min(max(s, 1 - eps_low), 1 + eps_high) * a)
        total += sum(w[i, t].item() * term for t in idx) / n
    return -total / logp.shape[0]


@pytest.mark.parametrize("seed", range(5))
def test_matches_loop_reference_with_weights(seed):
    logp, old, adv, mask, gen = _random_batch(seed)
    w = torch.rand(logp.shape, generator=gen) * 2
    loss, _ = gspo_loss(logp, old, adv, mask, 3e-3, 4e-3, token_weights=w)
    expected = _loop_reference(logp.detach(), old, adv, mask, w, 3e-3, 4e-3)
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_empty_rows_and_inf_padding_give_no_nan():
    logp = torch.tensor([[-1.0, -float("inf")], [-float("inf"), -float("inf")]]).requires_grad_()
    old = torch.tensor([[-1.0, -float("inf")], [0.0, 0.0]])
    mask = torch.tensor([[True, False], [False, False]])
    loss, m = gspo_loss(logp, old, torch.tensor([1.0, 5.0]), mask)
    # row 0: s = 1, J = 1; row 1 empty: 0 -> loss = -1/2
    assert loss.item() == -0.5
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert m["ratio_mean"].item() == 1.0 and m["clip_frac"].item() == 0.0
    # no valid token at all: loss 0, neutral metrics
    loss, m = gspo_loss(logp, old, torch.tensor([1.0, 5.0]), torch.zeros_like(mask))
    assert loss.item() == 0.0 and m["ratio_mean"].item() == 1.0


def test_num_seqs_and_ignored_num_tokens():
    logp, old, adv, mask = _hand_batch()
    full, _ = gspo_loss(logp, old, adv, mask, 0.2, 0.2)
    scaled, _ = gspo_loss(logp, old, adv, mask, 0.2, 0.2, num_seqs=4, num_tokens=123)
    assert scaled.item() == pytest.approx(full.item() / 2)
