"""Splitting a batch into micro-batches and summing their losses, with the GLOBAL num_seqs /
num_tokens, must give the full-batch loss and gradient (gradient-accumulation invariance)."""
import pytest
import torch

from ibpo_lit.algorithms import POLICY_LOSSES, LossInputs, LossSettings, aggregate

CASES = [("gspo", {}), *[("grpo", {"agg_mode": m}) for m in
                         ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")]]


def _batch(seed, b=7, t=10):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen) * 3
    logp = (old + torch.randn(b, t, generator=gen) * 0.1).requires_grad_()
    lengths = torch.randint(0, t + 1, (b,), generator=gen)
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.randn(b, generator=gen)
    w = torch.rand(b, t, generator=gen) + 0.5
    return logp, old, adv, mask, w


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name,kwargs", CASES)
@pytest.mark.parametrize("sizes", [(3, 4), (2, 2, 3)])
def test_chunk_losses_sum_to_full_loss(seed, name, kwargs, sizes):
    loss_fn = POLICY_LOSSES.get(name)
    logp, old, adv, mask, w = _batch(seed)
    settings = LossSettings(eps_low=0.05, eps_high=0.05, **kwargs)
    counts = {"num_seqs": mask.shape[0], "num_tokens": mask.sum().item()}

    full, _ = loss_fn(LossInputs(logp, old, adv, mask, token_weights=w, **counts), settings)
    (full_grad,) = torch.autograd.grad(full, logp)

    total = 0.0
    start = 0
    for size in sizes:
        rows = slice(start, start + size)
        start += size
        part, _ = loss_fn(LossInputs(logp[rows], old[rows], adv[rows], mask[rows], token_weights=w[rows], **counts),
                          settings)
        part.backward()  # gradients accumulate in logp.grad
        total += part.item()
    assert total == pytest.approx(full.item(), abs=1e-6)
    torch.testing.assert_close(logp.grad, full_grad, atol=1e-7, rtol=1e-5)


def test_local_denominators_would_break_token_mean():
    # The bug the global counts prevent: averaging per-chunk token means re-weights tokens.
    loss = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    full = aggregate(loss, mask, "token-mean")  # (3 + 4)/4 = 1.75
    naive = (aggregate(loss[:1], mask[:1], "token-mean") + aggregate(loss[1:], mask[1:], "token-mean")) / 2
    exact = sum(aggregate(loss[i : i + 1], mask[i : i + 1], "token-mean", num_tokens=4) for i in range(2))
    assert full.item() == 1.75 and naive.item() == 2.5 and exact.item() == 1.75
