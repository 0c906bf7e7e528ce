"""REINFORCE++ (``advantage_scale: reinforce_plus_plus``): the KL in every token's reward, the
outcome reward on the last, token returns, whitened over the batch's tokens; and the losses
taking [B, T] advantages."""
import math

import pytest
import torch

from ibpo_lit.algorithms import (
    ADVANTAGE_SCALES,
    TOKEN_ADVANTAGES,
    TokenAdvantageSettings,
    grpo_loss,
    gspo_loss,
    is_token_level,
    reinforce_plus_plus_advantages,
    rows_with_advantage,
    token_kl,
    token_returns,
    whiten,
)

NAN = float("nan")


def test_hand_derived_returns_and_whitening():
    # row 0: 3 tokens, kl [.1, .2, .3], reward 1; row 1: 2 tokens, kl [.5, .5], reward 0.
    # beta .5: token rewards row 0 [-.05, -.1, -.15 + 1] = [-.05, -.1, .85];
    #          row 1 [-.25, -.25]
    # returns (gamma 1, sums to the end): row 0 [.7, .75, .85]; row 1 [-.5, -.25]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 9.0]])  # 9 on padding: ignored
    rewards = torch.tensor([1.0, 0.0])
    returns = token_returns(rewards, kl, mask, kl_coef=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.7, 0.75, 0.85], [-0.5, -0.25, 0.0]]))
    # whitening over the 5 tokens: mean (.7+.75+.85-.5-.25)/5 = .31;
    # population var = mean of squared deviations
    values = [0.7, 0.75, 0.85, -0.5, -0.25]
    mean = sum(values) / 5
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 5)
    expected = torch.tensor([[0.7, 0.75, 0.85], [-0.5, -0.25, mean]]) - mean
    expected[1, 2] = 0.0
    expected[:, :] /= torch.tensor([[std, std, std], [std, std, 1.0]])
    out = reinforce_plus_plus_advantages(rewards, kl, mask, TokenAdvantageSettings(kl_coef=0.5))
    torch.testing.assert_close(out, expected)
    assert out[mask].mean().abs() < 1e-6 and out[mask].std(unbiased=False) == pytest.approx(1.0, abs=1e-5)
    # gamma .5: row 0 returns [-.05 + .5*(-.1 + .5*.85), -.1 + .5*.85, .85] = [.1125, .325, .85]
    torch.testing.assert_close(token_returns(rewards, kl, mask, 0.5, gamma=0.5)[0], torch.tensor([0.1125, 0.325, 0.85]))


def _loop_reference(rewards, kl, mask, beta, gamma):
    """Plain Python: per-token rewards, returns, then whitening over every valid token of
    finite-reward rows (population variance, clamped at 1e-8)."""
    B, T = len(rewards), len(mask[0])
    returns = [[0.0] * T for _ in range(B)]
    kept = []
    for i in range(B):
        length = sum(mask[i])  # masks here are prefixes
        if not math.isfinite(rewards[i]) or length == 0:
            continue
        r = [-beta * kl[i][t] for t in range(length)]
        r[length - 1] += rewards[i]
        g = 0.0
        for t in reversed(range(length)):
            g = r[t] + gamma * g
            returns[i][t] = g
            kept.append((i, t))
    n = len(kept)
    mean = sum(returns[i][t] for i, t in kept) / max(n, 1)
    var = max(sum((returns[i][t] - mean) ** 2 for i, t in kept) / max(n, 1), 1e-8)
    out = [[0.0] * T for _ in range(B)]
    for i, t in kept:
        out[i][t] = (returns[i][t] - mean) / math.sqrt(var)
    return out


def _random_batch(seed, B=7, T=11):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    kl = torch.randn(B, T, generator=gen, dtype=torch.float64).abs() * 0.3
    rewards = torch.randint(0, 2, (B,), generator=gen).double()
    rewards[torch.rand(B, generator=gen) < 0.2] = NAN
    return rewards, kl, mask


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("beta", "gamma"), [(0.0, 1.0), (0.1, 1.0), (0.2, 0.9)])
def test_matches_loop_reference(seed, beta, gamma):
    rewards, kl, mask = _random_batch(seed)
    expected = torch.tensor(_loop_reference(rewards.tolist(), kl.tolist(), mask.int().tolist(), beta, gamma),
                            dtype=torch.float64)
    out = reinforce_plus_plus_advantages(rewards, kl, mask, TokenAdvantageSettings(beta, gamma))
    torch.testing.assert_close(out, expected)


# The peers, as their code reads (verl core_algos / ray_trainer, OpenRLHF experience_maker /
# models.utils), rewritten here on dense tensors without NaN rows.
def _verl(rewards, old_logp, ref_logp, mask, beta, gamma):
    scores = torch.zeros_like(old_logp)
    lengths = mask.sum(-1).long()
    scores[torch.arange(len(rewards)), lengths - 1] = rewards  # the score at the last valid token
    token_rewards = scores - beta * (old_logp - ref_logp) * mask  # apply_kl_penalty, kl_penalty "kl"
    returns, running = torch.zeros_like(token_rewards), 0.0
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]  # reset after EOS
    n = mask.sum()
    mean = (returns * mask).sum() / n
    var = ((returns - mean) ** 2 * mask).sum() / n * n / (n - 1)  # masked_var(unbiased=True)
    return (returns - mean) * torch.rsqrt(var + 1e-8) * mask


def _openrlhf(rewards, old_logp, ref_logp, mask, beta, gamma):
    kl = (old_logp - ref_logp).clamp(-10, 10)  # compute_approx_kl, k1
    eos = mask.shape[1] - 1 - mask.long().fliplr().argmax(dim=1, keepdim=True)
    token_rewards = torch.zeros_like(kl).scatter_(1, eos, rewards[:, None]) - beta * kl
    token_rewards = token_rewards * mask
    returns, running = torch.zeros_like(token_rewards), 0.0
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
    n = mask.sum()
    mean = (returns * mask).sum() / n
    var = ((returns - mean) ** 2 * mask).sum() / n
    return (returns - mean) * var.clamp(min=1e-8).rsqrt()


@pytest.mark.parametrize("gamma", [1.0, 0.95])
def test_agrees_with_the_peers_semantics(gamma):
    gen = torch.Generator().manual_seed(7)
    B, T = 6, 9
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B, 1), generator=gen)
    ref = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    old = ref + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.2
    rewards = torch.randint(0, 2, (B,), generator=gen).double()
    beta = 0.05
    ours = reinforce_plus_plus_advantages(rewards, token_kl(old, ref, mask, "k1").double(), mask,
                                          TokenAdvantageSettings(beta, gamma))
    # OpenRLHF: the same numbers on valid tokens (it leaves padding unmasked; the loss masks it)
    torch.testing.assert_close(ours[mask], _openrlhf(rewards, old, ref, mask.double(), beta, gamma)[mask],
                               rtol=1e-4, atol=1e-5)  # token_kl is float32
    # verl: the same up to its Bessel-corrected variance, sqrt(n / (n - 1)) over n tokens
    n = int(mask.sum())
    verl = _verl(rewards, old, ref, mask.double(), beta, gamma)
    torch.testing.assert_close(ours, verl * math.sqrt(n / (n - 1)), rtol=1e-4, atol=1e-4)


def test_unscorable_rows_and_degenerate_batches_are_zero_never_nan():
    mask = torch.ones(3, 4, dtype=torch.bool)
    kl = torch.full((3, 4), 0.1)
    # one unscorable row: left out of the statistics, 0 everywhere
    out = reinforce_plus_plus_advantages(torch.tensor([1.0, 0.0, NAN]), kl, mask, TokenAdvantageSettings(0.1))
    assert torch.equal(out[2], torch.zeros(4)) and torch.isfinite(out).all()
    alone = reinforce_plus_plus_advantages(torch.tensor([1.0, 0.0]), kl[:2], mask[:2], TokenAdvantageSettings(0.1))
    torch.testing.assert_close(out[:2], alone)
    # every token's return equal (no KL, equal rewards, one token each): 0, not NaN
    one = torch.tensor([[True, False], [True, False]])
    assert torch.equal(reinforce_plus_plus_advantages(torch.ones(2), None, one), torch.zeros(2, 2))
    # nothing valid at all, and an empty batch
    assert torch.equal(reinforce_plus_plus_advantages(torch.full((2,), NAN), None, one), torch.zeros(2, 2))
    assert reinforce_plus_plus_advantages(torch.zeros(0), None, torch.zeros(0, 5, dtype=torch.bool)).shape == (0, 5)
    # -inf log-probs on padding do not leak
    logp = torch.tensor([[-1.0, -float("inf")]])
    assert torch.equal(token_kl(logp, torch.tensor([[-2.0, -float("inf")]]), torch.tensor([[True, False]])),
                       torch.tensor([[1.0, 0.0]]))


def test_whiten_with_a_total_over_processes():
    # ``total`` sums over processes; a stand-in that adds a second process's fixed share shows
    # that the statistics are the union's: whitening half with the other's sums = whitening all.
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    full = whiten(values, mask)
    other = values[1:], mask[1:]
    calls = []

    def total(xs):
        calls.append(len(xs))
        if len(xs) == 2:  # count, sum
            return [xs[0] + float(other[1].sum()), xs[1] + float(other[0][other[1]].sum())]
        mean = float(values[mask].mean())
        return [xs[0] + float(((other[0][other[1]] - mean) ** 2).sum())]

    torch.testing.assert_close(whiten(values[:1], mask[:1], total), full[:1])
    assert calls == [2, 1]  # the same collectives on every process, whatever its data


def test_registry_and_names():
    assert TOKEN_ADVANTAGES.names() == ["reinforce_plus_plus"]
    assert TOKEN_ADVANTAGES.get("reinforce_plus_plus") is reinforce_plus_plus_advantages
    assert is_token_level("reinforce_plus_plus") and not any(is_token_level(n) for n in ADVANTAGE_SCALES.names())
    with pytest.raises(ValueError, match="valid: batch, group, none, reinforce_plus_plus, reinforce_plus_plus_baseline"):
        is_token_level("reinforce")
    assert rows_with_advantage(torch.tensor([0.0, 1.0])).tolist() == [False, True]
    assert rows_with_advantage(torch.tensor([[0.0, 0.0], [0.0, -1.0]])).tolist() == [False, True]
    with pytest.raises(ValueError, match="gamma"):
        token_returns(torch.ones(1), None, torch.ones(1, 2), gamma=0.0)


# ----------------------------------------------------------------------------- the losses
def _loss_batch(seed, B=5, T=7):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=gen) * 3
    logp = old + torch.randn(B, T, generator=gen) * 0.05
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B, 1), generator=gen)
    return logp, old, mask, gen


@pytest.mark.parametrize("loss_fn", [gspo_loss, grpo_loss], ids=["gspo", "grpo"])
@pytest.mark.parametrize("seed", range(3))
def test_row_constant_token_advantages_equal_sequence_advantages(loss_fn, seed):
    logp, old, mask, gen = _loss_batch(seed)
    adv = torch.randn(5, generator=gen)
    a = logp.clone().requires_grad_()
    b = logp.clone().requires_grad_()
    seq, m1 = loss_fn(a, old, adv, mask, eps_low=0.01, eps_high=0.01)
    tok, m2 = loss_fn(b, old, adv[:, None].expand_as(mask).clone(), mask, eps_low=0.01, eps_high=0.01)
    torch.testing.assert_close(tok, seq)
    seq.backward()
    tok.backward()
    torch.testing.assert_close(b.grad, a.grad)
    torch.testing.assert_close(m2["clip_frac"], m1["clip_frac"])


@pytest.mark.parametrize("seed", range(3))
def test_gspo_token_advantages_match_a_loop(seed):
    # J_i = (1/|y_i|) sum_t min(s_i A_it, clip(s_i) A_it); loss = -mean_i J_i
    logp, old, mask, gen = _loss_batch(seed)
    adv = torch.randn(5, 7, generator=gen)
    eps = 0.01
    loss, metrics = gspo_loss(logp, old, adv, mask, eps_low=eps, eps_high=eps)
    total, clipped = 0.0, []
    for i in range(5):
        n = int(mask[i].sum())
        s = math.exp(sum(float(logp[i, t] - old[i, t]) for t in range(n)) / n)
        sc = min(max(s, 1 - eps), 1 + eps)
        total += sum(min(s * float(adv[i, t]), sc * float(adv[i, t])) for t in range(n)) / n
        clipped.append(sum((float(adv[i, t]) > 0 and s > 1 + eps) or (float(adv[i, t]) < 0 and s < 1 - eps)
                           for t in range(n)) / n)
    assert loss.item() == pytest.approx(-total / 5, abs=1e-6)
    assert metrics["clip_frac"].item() == pytest.approx(sum(clipped) / 5, abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_grpo_token_advantages_match_a_loop(seed):
    logp, old, mask, gen = _loss_batch(seed)
    adv = torch.randn(5, 7, generator=gen)
    loss, _ = grpo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2, agg_mode="token-mean")
    terms = []
    for i in range(5):
        for t in range(int(mask[i].sum())):
            rho = math.exp(float(logp[i, t] - old[i, t]))
            a = float(adv[i, t])
            terms.append(-min(rho * a, min(max(rho, 0.8), 1.2) * a))
    assert loss.item() == pytest.approx(sum(terms) / len(terms), abs=1e-6)


def test_losses_reject_advantages_of_another_shape():
    logp, old, mask, _ = _loss_batch(0)
    for loss_fn in (gspo_loss, grpo_loss):
        with pytest.raises(ValueError, match=r"\[B\] or \[B, T\]"):
            loss_fn(logp, old, torch.zeros(5, 3), mask)
