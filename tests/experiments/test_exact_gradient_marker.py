"""The exact-gradient testbed's marker corrector (issue 46, item 1): corrections drawn and trained
under an input feature the policy's rollouts never carry, so what is learnt on them does not
transfer to the original prompts for free; and ``learning_curve``'s stop at a cost budget."""
import pytest
import torch

from ibpo_lit.experiments.exact_gradient.catalog import DEFAULT_CORRECTOR
from ibpo_lit.experiments.exact_gradient.corrector import CorrectorSpec
from ibpo_lit.experiments.exact_gradient.estimators import Method, draw_loss
from ibpo_lit.experiments.exact_gradient.measure import draw_generators, learning_curve
from ibpo_lit.experiments.exact_gradient.policy import TinyPolicy, flat_grad
from ibpo_lit.experiments.exact_gradient.problem import Problem

SMALL = Problem(num_prompts=3, length=5, vocab=2, seed=1)
MARKER = CorrectorSpec("informative", skill=0.75, locality=0.1, marker=True)


@pytest.fixture(autouse=True)
def _one_thread(one_intra_op_thread):
    yield


def _marker_column(policy: TinyPolicy) -> torch.Tensor:
    return policy.net[0].weight[:, -1]


def test_marked_policy_keeps_the_unmarked_weights_and_rollouts_never_see_the_marker():
    plain, marked = TinyPolicy(SMALL, hidden=16, seed=3), TinyPolicy(SMALL, hidden=16, seed=3, marker=True)
    assert torch.equal(plain.net[0].weight, marked.net[0].weight[:, :-1])
    assert torch.equal(plain.net[2].weight, marked.net[2].weight)
    before, before_marked = marked.log_table().detach(), marked.log_table(marked=True).detach()
    with torch.no_grad():
        _marker_column(marked).add_(0.5)
    assert torch.equal(marked.log_table().detach(), before)  # rollouts: bit for bit, whatever the column
    assert (marked.log_table(marked=True).detach() - before_marked).abs().max() > 1e-3
    with pytest.raises(ValueError, match="marker=True"):
        plain.log_table(marked=True)


def _step_gains(marker: bool) -> tuple[float, float, float, float]:
    """(gain of the correction's own log-prob, gain of the same sequence's rollout log-prob) of a
    small gradient step on the correction's log-prob, and their first-order predictions."""
    policy = TinyPolicy(SMALL, hidden=16, seed=0, marker=True)
    with torch.no_grad():
        _marker_column(policy).zero_()  # both views act alike here: the gap is in what a step can move
    prompts, seqs = torch.tensor([0, 1, 2]), torch.tensor([[1, 0, 1, 1, 0], [0, 0, 1, 0, 1], [1, 1, 1, 0, 0]])
    correction = policy.token_logp(prompts, seqs, marked=marker).sum()
    rollout = policy.token_logp(prompts, seqs).sum()
    g_c = flat_grad(correction, policy)
    g_r = flat_grad(rollout, policy)
    lr = 1e-7
    with torch.no_grad():
        offset = 0
        for p in policy.parameters():
            p.add_(lr * g_c[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    with torch.no_grad():
        gain_c = float(policy.token_logp(prompts, seqs, marked=marker).sum() - correction)
        gain_r = float(policy.token_logp(prompts, seqs).sum() - rollout)
    return gain_c, gain_r, lr * float(g_c @ g_c), lr * float(g_r @ g_c)


def test_a_step_on_marked_corrections_transfers_less_than_it_learns_hand_derived():
    # With the marker column at 0 the marked input's hidden pre-activations are the rollout's, so
    # the correction's gradient is the rollout's gradient plus one more block, the marker column,
    # which equals the first layer's bias gradient (the marker is 1, like the bias input):
    # g_c = (g_r, g_b1). A step lr * g_c raises the correction's log-prob by lr |g_c|^2 and the
    # rollout's by lr g_r . g_c = lr |g_r|^2 = lr (|g_c|^2 - |g_b1|^2): strictly less.
    policy = TinyPolicy(SMALL, hidden=16, seed=0, marker=True)
    with torch.no_grad():
        _marker_column(policy).zero_()
    prompts, seqs = torch.tensor([0, 1]), torch.tensor([[1, 0, 1, 1, 0], [0, 0, 1, 0, 1]])
    policy.zero_grad()
    policy.token_logp(prompts, seqs, marked=True).sum().backward()
    assert torch.allclose(policy.net[0].weight.grad[:, -1], policy.net[0].bias.grad, rtol=0, atol=1e-14)
    gain_c, gain_r, predicted_c, predicted_r = _step_gains(marker=True)
    assert gain_c == pytest.approx(predicted_c, rel=1e-4) and gain_r == pytest.approx(predicted_r, rel=1e-4)
    assert gain_r < 0.99 * gain_c  # what crosses to the rollouts is a strict part of what was learnt
    # the guard off: without the marker the correction is the rollout, and the step transfers in full
    gain_c, gain_r, _, _ = _step_gains(marker=False)
    assert gain_r == pytest.approx(gain_c, rel=1e-9)


def test_marker_enters_the_estimate_only_through_trained_corrections():
    policy = TinyPolicy(SMALL, hidden=16, seed=2, marker=True)
    table = policy.log_table().detach()
    column = sum(p.numel() for p in policy.parameters()) - policy.net[2].weight.numel() - policy.net[2].bias.numel() \
        - policy.net[0].bias.numel()  # flat_grad's order: W1 (row-major), b1, W2, b2

    def marker_grad(method: Method) -> torch.Tensor:
        loss, info, _ = draw_loss(method, policy, table, *draw_generators(0, 0))
        assert info.corrections > 0
        grad = flat_grad(loss, policy).view(-1)[:column].view(16, -1)
        return grad[:, -1]

    trained = Method("ibpo", variant="plain", group_size=4, corrector=MARKER)
    assert marker_grad(trained).abs().max() > 0
    assert torch.equal(marker_grad(trained.with_(train_on_corrections=False)), torch.zeros(16, dtype=torch.float64))
    with pytest.raises(ValueError, match="marker=True"):
        draw_loss(trained, TinyPolicy(SMALL, hidden=16, seed=2), table, *draw_generators(0, 0))


def test_learning_curve_with_the_marker_corrector_differs_and_stops_at_its_budget():
    problem = Problem(num_prompts=3, length=5, seed=1)
    plain = Method("ibpo", variant="plain", group_size=4, corrector=DEFAULT_CORRECTOR)
    a = learning_curve(plain, problem, seed=0, lr=0.01, steps=4, hidden=16)
    b = learning_curve(plain.with_(corrector=MARKER), problem, seed=0, lr=0.01, steps=4, hidden=16)
    assert a["curve"][0] == pytest.approx(b["curve"][0], abs=1e-12)  # the same initial policy on rollouts
    assert a["curve"][1:] != b["curve"][1:]
    gspo = Method("gspo", group_size=4)  # 12 sequences a step, each of 1 + T = 6 context tokens
    out = learning_curve(gspo, problem, seed=0, lr=0.01, steps=100, hidden=16, until={"sequences": 30})
    assert out["sequences"] == [0, 12, 24, 36] and out["context_tokens"] == [0, 72, 144, 216]
    out = learning_curve(gspo, problem, seed=0, lr=0.01, steps=100, hidden=16,
                         until={"sequences": 30, "context_tokens": 250})
    assert out["sequences"][-1] == 48 and len(out["curve"]) == 5  # tokens reach 250 only at 288
