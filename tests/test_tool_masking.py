"""Tool-output tokens (``RolloutBatch.tool_mask``) are context, not samples: the policy update's
loss, importance ratio, KL and token counts ignore them (``policy_mask``)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from ibpo_lit.config import AlgorithmConfig, OptimConfig, RolloutConfig
from ibpo_lit.models import build_tiny_model
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.step_types import StepStats
from ibpo_lit.training.update import PolicyUpdate, UpdateRuntime


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


def _batch(tool: bool) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 90, (4,), generator=g).tolist() for _ in range(4)]
    responses = [torch.randint(3, 90, (8,), generator=g).tolist() for _ in range(4)]
    tools = [[2 <= t < 5 for t in range(8)] if tool else [False] * 8 for _ in range(4)]
    return RolloutBatch.from_lists(prompts, responses, [[-1.0] * 8] * 4, [True] * 4, list(range(4)), [0, 0, 1, 1],
                                   pad_token_id=0, tool_masks=tools)


@pytest.mark.parametrize("loss", ["gspo", "grpo"])
def test_the_loss_ignores_what_happens_on_tool_tokens(model, loss):
    updater = PolicyUpdate(AlgorithmConfig(loss=loss, beta_kl=0.1, eps_low=0.2, eps_high=0.2), RolloutConfig(),
                           OptimConfig(), max_nonfinite_steps=5, logprob_chunk_tokens=None)
    updater.bind(model, build_tiny_model(seed=1).requires_grad_(False), UpdateRuntime(step_stats=StepStats()))
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])

    def loss_with(batch, old_on_tools):
        old = torch.full(batch.response_ids.shape, -1.0)
        old[batch.response_mask & batch.tool_mask] = old_on_tools  # pi_old where nothing was sampled
        ref = updater.ref_logprobs(batch)
        with torch.no_grad():
            value, _ = updater.policy_loss(batch, advantages, None, old_logp=old, ref_logp=ref)
        return float(value)

    tool, plain = _batch(tool=True), _batch(tool=False)
    assert loss_with(tool, -1.0) == pytest.approx(loss_with(tool, -40.0), abs=1e-7)
    old = torch.full(plain.response_ids.shape, -1.0)
    old[:, 2:5] = -40.0  # the same change on tokens that are the policy's moves the loss
    with torch.no_grad():
        moved, _ = updater.policy_loss(plain, advantages, None, old_logp=old, ref_logp=updater.ref_logprobs(plain))
    assert abs(float(moved) - loss_with(plain, -1.0)) > 1e-3
    assert int(tool.policy_mask.sum()) == 4 * 5 and int(tool.response_mask.sum()) == 4 * 8
    # a batch's trained tokens, for the denominators: tool tokens are not among them
    assert dataclasses.replace(tool).policy_mask.sum() < tool.response_mask.sum()
