"""``PolicyUpdate.group_gradients`` on the tiny model, against plain ``autograd.grad`` of
``policy_loss`` over each group in one forward: the update's row rule and micro-batches change
nothing but the float order; zero-advantage rows give no gradient unless a KL term is on; the
module's ``.grad`` and token counters are left alone."""
from __future__ import annotations

import copy

import pytest
import torch

from ibpo_lit.config import AlgorithmConfig, OptimConfig, RolloutConfig
from ibpo_lit.models import build_tiny_model
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.step_types import StepStats, UpdateBatch
from ibpo_lit.training.update import PolicyUpdate, UpdateRuntime

ROWS = 10


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def update(model):
    """10 rows of random tokens, prompts of 3 to 7 and responses of 1 to 9 tokens (one empty);
    advantages N(0, 1) with rows 0, 3, 6, 9 at exactly 0."""
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (3 + i % 5,), generator=g).tolist() for i in range(ROWS)]
    responses = [torch.randint(3, vocab, (0 if i == 4 else 1 + (7 * i) % 9,), generator=g).tolist()
                 for i in range(ROWS)]
    batch = RolloutBatch.from_lists(prompts, responses, [[-1.0] * len(r) for r in responses], [True] * ROWS,
                                    list(range(ROWS)), [i // 2 for i in range(ROWS)], pad_token_id=0)
    advantages = torch.randn(ROWS, generator=g)
    advantages[::3] = 0.0
    return UpdateBatch(batch=batch, advantages=advantages, token_weights=None)


def _updater(model, beta_kl=0.0, micro_batch_size=3):
    updater = PolicyUpdate(AlgorithmConfig(beta_kl=beta_kl), RolloutConfig(micro_batch_size=micro_batch_size),
                           OptimConfig(), max_nonfinite_steps=5, logprob_chunk_tokens=None)
    ref = None
    if beta_kl > 0:  # a reference the policy has moved away from: the KL term has a gradient
        ref = copy.deepcopy(model).requires_grad_(False)
        with torch.no_grad():
            for p in ref.parameters():
                p.mul_(0.9)
    updater.bind(model, ref, UpdateRuntime(step_stats=StepStats()))
    return updater


def _params(model):
    return [p for name, p in model.named_parameters() if "layers.0." in name or "embed_tokens" in name]


def _plain(updater, update, rows, params, num_seqs=None, num_tokens=None):
    """One forward over ``rows``, every row, no micro-batches."""
    part = update.batch.select(rows)
    loss, _ = updater.policy_loss(part, update.advantages[rows], None, num_seqs=num_seqs, num_tokens=num_tokens,
                                  ref_logp=updater.ref_logprobs(part))
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])


def _close(a, b):
    scale = b.abs().max().item() + 1e-12
    return torch.allclose(a, b, atol=1e-5 * scale, rtol=1e-4)


@pytest.mark.parametrize("beta_kl", [0.0, 0.1])
def test_each_group_is_its_own_mean_and_batch_shares_add_up(model, update, beta_kl):
    updater = _updater(model, beta_kl)
    params = _params(model)
    groups = [torch.tensor([0, 1, 2, 5]), torch.tensor([3, 4, 6, 7, 8, 9])]
    own = updater.group_gradients(update, groups, params)
    assert own.shape == (2, sum(p.numel() for p in params)) and own.dtype == torch.float32
    for rows, grad in zip(groups, own):
        assert _close(grad, _plain(updater, update, rows, params))
    shares = updater.group_gradients(update, groups, params, denominators="batch")
    everything = _plain(updater, update, torch.arange(ROWS), params)
    assert _close(shares.sum(0), everything)  # a partition's shares are the batch's gradient
    # GSPO and the KL term average over sequences: a share is its group's mean times n_k / N
    n = torch.tensor([float(len(r)) for r in groups])
    assert _close(shares, own * (n / ROWS)[:, None])


def test_zero_advantage_rows_have_a_gradient_only_through_the_kl_term(model, update):
    params = _params(model)
    zero = torch.tensor([0, 3, 6, 9])  # rows whose advantage is exactly 0
    assert (update.advantages[zero] == 0).all()
    plain = _updater(model).group_gradients(update, [zero], params)
    assert torch.count_nonzero(plain) == 0  # skipped, as the update skips them
    kl = _updater(model, beta_kl=0.1).group_gradients(update, [zero], params)
    assert torch.count_nonzero(kl) > 0 and _close(kl[0], _plain(_updater(model, 0.1), update, zero, params))


def test_the_module_state_is_left_alone(model, update):
    updater = _updater(model, beta_kl=0.1, micro_batch_size=2)
    for p in model.parameters():
        p.grad = None
    updater.group_gradients(update, [torch.arange(ROWS)], _params(model))
    assert all(p.grad is None for p in model.parameters())
    assert updater.runtime.step_stats == StepStats()  # a diagnostic's forwards are not the run's compute
    with pytest.raises(ValueError, match="denominators"):
        updater.group_gradients(update, [torch.arange(ROWS)], _params(model), denominators="rows")
