"""KL estimators and the entropy term (algorithms/regularizers.py), by hand and by their expected
gradients: what each estimator's gradient follows is the thing a user chooses it for."""
import math

import pytest
import torch

from ibpo_lit.algorithms import aggregate, grpo_loss, token_entropy
from ibpo_lit.algorithms.regularizers import KL_ESTIMATORS, RegularizerSettings, regularizers


def test_estimator_values_by_hand():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = logp + torch.tensor([[math.log(2.0), 0.0]])  # d = ref - logp = [log 2, 0]
    assert KL_ESTIMATORS.get("k1")(logp, ref)[0].tolist() == pytest.approx([-math.log(2), 0.0])
    assert KL_ESTIMATORS.get("k2")(logp, ref)[0].tolist() == pytest.approx([0.5 * math.log(2) ** 2, 0.0])
    assert KL_ESTIMATORS.get("k3")(logp, ref)[0].tolist() == pytest.approx([2 - math.log(2) - 1, 0.0])


def _expected_gradient(estimator: str, theta: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """E_{y ~ pi}[grad_theta k(log pi(y), log ref(y))]: every token weighted by its probability,
    the sample itself held fixed (as a loss on sampled tokens is differentiated)."""
    theta = theta.clone().requires_grad_(True)
    logp, ref = torch.log_softmax(theta, -1), torch.log_softmax(ref_logits, -1)
    k = KL_ESTIMATORS.get(estimator)(logp, ref)
    (grad,) = torch.autograd.grad((logp.exp().detach() * k).sum(), theta)
    return grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_estimators_gradient_follows_the_divergence_the_docs_name(seed):
    g = torch.Generator().manual_seed(seed)
    theta, ref_logits = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)

    def kl(p_logits, q_logits):
        p = torch.softmax(p_logits, -1)
        return (p * (torch.log_softmax(p_logits, -1) - torch.log_softmax(q_logits, -1))).sum()

    t = theta.clone().requires_grad_(True)
    (reverse,) = torch.autograd.grad(kl(t, ref_logits), t)  # grad KL(pi || ref)
    t = theta.clone().requires_grad_(True)
    (forward,) = torch.autograd.grad(kl(ref_logits, t), t)  # grad KL(ref || pi)
    torch.testing.assert_close(_expected_gradient("k1", theta, ref_logits), torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(_expected_gradient("k2", theta, ref_logits), reverse)
    torch.testing.assert_close(_expected_gradient("k3", theta, ref_logits), forward)
    assert not torch.allclose(reverse, forward)  # the distinction is real here


def test_kl_is_aggregated_like_the_loss_and_adds_to_it():
    # GRPO with the k3 penalty inside each token's loss, as it was written before the KL moved out.
    g = torch.Generator().manual_seed(0)
    logp, old, ref = (torch.randn(3, 5, generator=g) for _ in range(3))
    adv, mask = torch.tensor([1.0, -0.5, 0.0]), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    for mode in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum"):
        loss, _ = grpo_loss(logp, old, adv, mask, agg_mode=mode)
        extra, metrics = regularizers(logp, mask, RegularizerSettings(beta_kl=0.1, agg_mode=mode), ref_logp=ref)
        d = ref - logp
        inside = aggregate(-(torch.minimum(torch.exp(logp - old) * adv[:, None],
                                           torch.exp(logp - old).clamp(0.8, 1.2) * adv[:, None]))
                           + 0.1 * (torch.exp(d) - d - 1), mask, mode)
        assert (loss + extra).item() == pytest.approx(inside.item(), rel=1e-5)  # float32 sums in another order
        k3 = torch.exp(d) - d - 1
        assert metrics["kl"].item() == pytest.approx(float(k3[mask.bool()].mean()), rel=1e-6)


def test_entropy_bonus_lowers_the_loss_and_its_gradient_raises_entropy():
    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]], requires_grad=True)
    mask = torch.ones(1, 2)
    entropy = token_entropy(logits)
    term, metrics = regularizers(torch.zeros(1, 2), mask, RegularizerSettings(entropy_coef=0.5), entropy=entropy)
    assert term.item() == pytest.approx(-0.5 * float(entropy.mean()))
    assert metrics["entropy"].item() == pytest.approx(float(entropy.mean()))
    term.backward()
    with torch.no_grad():  # a small step against the gradient: the entropy grows
        assert float(token_entropy(logits - 0.1 * logits.grad).mean()) > float(entropy.mean())


def test_token_entropy_by_hand_and_with_temperature():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [50.0, 0.0, 0.0, -1e4]])
    assert token_entropy(logits).tolist() == pytest.approx([math.log(4), 0.0], abs=1e-6)
    p = torch.softmax(torch.tensor([1.0, 2.0, 3.0]) / 0.7, -1)
    assert token_entropy(torch.tensor([1.0, 2.0, 3.0]), 0.7).item() == pytest.approx(float(-(p * p.log()).sum()))


def test_missing_inputs_and_bad_settings_are_refused():
    logp, mask = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="ref_logp"):
        regularizers(logp, mask, RegularizerSettings(beta_kl=0.1))
    with pytest.raises(ValueError, match="entropy"):
        regularizers(logp, mask, RegularizerSettings(entropy_coef=0.1))
    with pytest.raises(ValueError, match="KL estimator"):
        regularizers(logp, mask, RegularizerSettings(beta_kl=0.1, kl_estimator="k4"), ref_logp=logp)
    term, metrics = regularizers(logp, mask, RegularizerSettings())
    assert term.item() == 0.0 and metrics == {}
