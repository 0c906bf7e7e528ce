"""REINFORCE++ in a step (``advantage_scale: reinforce_plus_plus``): the settings it takes and
refuses, and the assembled update: the reference's log-probs before the advantages, the KL in the
reward (not the loss), IBPO's shaped reward on the last token, rollouts and correction samples
whitened together, truncated rows masked."""
import math

import pytest
import torch

from ibpo_lit.algorithms import TokenAdvantageSettings, reinforce_plus_plus_advantages, token_kl
from ibpo_lit.config import AlgorithmConfig, DynamicSamplingConfig, IBPOConfig, OverlongConfig
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.assemble import assemble_update
from ibpo_lit.training.step_types import Corrections, ScoredRollouts

RPP = "reinforce_plus_plus"


# ---------------------------------------------------------------------------- the settings
def test_beta_kl_goes_into_the_reward_and_not_the_loss():
    algo = AlgorithmConfig(advantage_scale=RPP, beta_kl=0.05)
    assert algo.token_level_advantages and algo.kl_in_reward and algo.needs_reference
    assert algo.regularizer_settings.beta_kl == 0.0 and not algo.regularizer_settings.needs_ref_logp
    assert algo.token_advantage_settings == TokenAdvantageSettings(kl_coef=0.05, gamma=1.0)
    # k1 in the reward, k3 in a loss term, unless kl_estimator says otherwise (both peers' defaults)
    assert algo.reward_kl_estimator == "k1"
    assert AlgorithmConfig(beta_kl=0.05).regularizer_settings.kl_estimator == "k3"
    assert AlgorithmConfig(advantage_scale=RPP, beta_kl=0.05, kl_estimator="k3").reward_kl_estimator == "k3"
    # a group-relative estimator keeps the KL in the loss
    group = AlgorithmConfig(beta_kl=0.05)
    assert group.regularizer_settings.beta_kl == 0.05 and not group.kl_in_reward and not group.token_level_advantages
    # beta 0: REINFORCE++ without a KL, no reference needed
    plain = AlgorithmConfig(advantage_scale=RPP)
    assert not plain.kl_in_reward and not plain.needs_reference


def test_settings_refused_with_a_message_naming_the_field():
    with pytest.raises(ValueError, match="unknown advantage estimator 'reinforce'; valid: batch, group, none, "
                                         "reinforce_plus_plus, reinforce_plus_plus_baseline, rloo"):
        AlgorithmConfig(advantage_scale="reinforce")
    with pytest.raises(ValueError, match=r"algorithm.gamma must be in \(0, 1\]"):
        AlgorithmConfig(advantage_scale=RPP, gamma=0.0)
    with pytest.raises(ValueError, match="algorithm.gamma=0.9 discounts token returns"):
        AlgorithmConfig(gamma=0.9)
    with pytest.raises(ValueError, match="algorithm.dynamic_sampling"):
        AlgorithmConfig(advantage_scale=RPP, dynamic_sampling=DynamicSamplingConfig(enabled=True))
    with pytest.raises(ValueError, match="unknown KL estimator"):
        AlgorithmConfig(advantage_scale=RPP, beta_kl=0.1, kl_estimator="k4")
    assert AlgorithmConfig(advantage_scale=RPP, gamma=0.99).gamma == 0.99


# ---------------------------------------------------------------------------- the assembly
def _step(rewards, lengths, finished=None, logp=0.0):
    n = len(rewards)
    finished = finished or [True] * n
    batch = RolloutBatch.from_lists([[5, 6]] * n, [[7] * length for length in lengths],
                                    [[logp] * length for length in lengths], finished, list(range(n)),
                                    [i // 2 for i in range(n)], pad_token_id=0)
    return ScoredRollouts(prompts=[Prompt([5, 6], "p", "1")] * (n // 2), rollouts=batch, texts=[""] * n,
                          rewards=torch.tensor(rewards), step=0)


def _reference(shift):
    """A stand-in for the module's reference forward: the sampled log-probs minus ``shift``."""
    calls = []

    def reference_logprobs(batch):
        calls.append(len(batch))
        return torch.where(batch.response_mask, batch.rollout_logp - shift, 0.0)

    return reference_logprobs, calls


def _algo(**kw):
    return AlgorithmConfig(advantage_scale=RPP, ibpo=kw.pop("ibpo", IBPOConfig(variant="none")), **kw)


def test_assembled_advantages_are_the_formula_with_the_k1_kl_of_sampled_and_reference_log_probs():
    step = _step([1.0, 0.0, 0.0, 1.0], lengths=[3, 5, 2, 4], logp=-1.0)
    reference, calls = _reference(shift=0.2)  # k1 = logp - ref = 0.2 on every token
    metrics = assemble_update(step, _algo(beta_kl=0.5), pad_token_id=0, reference_logprobs=reference)
    assert calls == [4]  # one reference pass over the batch, before the advantages
    mask = step.rollouts.response_mask
    adv = step.update.advantages
    assert adv.shape == mask.shape
    expected = reinforce_plus_plus_advantages(step.rewards, torch.where(mask, 0.2, 0.0), mask,
                                              TokenAdvantageSettings(kl_coef=0.5))
    torch.testing.assert_close(adv, expected)
    # by hand, row 0: rewards [-.1, -.1, -.1 + 1] -> returns [.7, .8, .9] (before whitening)
    returns = {0: [0.7, 0.8, 0.9], 1: [-0.5, -0.4, -0.3, -0.2, -0.1], 2: [-0.2, -0.1], 3: [0.6, 0.7, 0.8, 0.9]}
    flat = [v for row in returns.values() for v in row]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((v - mean) ** 2 for v in flat) / len(flat))
    torch.testing.assert_close(adv[0, :3], (torch.tensor(returns[0]) - mean) / std)
    assert torch.equal(adv[~mask], torch.zeros(int((~mask).sum())))
    assert metrics["train/kl"] == pytest.approx(0.2)


def test_without_beta_no_reference_is_asked_for():
    step = _step([1.0, 0.0, 0.0, 0.0], lengths=[2, 2, 2, 2])
    metrics = assemble_update(step, _algo(), pad_token_id=0)  # no reference_logprobs: none needed
    assert "train/kl" not in metrics
    # no KL, one token's reward per row: each row's tokens all have the whitened outcome reward
    mean, std = 0.25, math.sqrt(0.25 * 0.75)
    torch.testing.assert_close(step.update.advantages[:, 0], (torch.tensor([1.0, 0, 0, 0]) - mean) / std)
    with pytest.raises(ValueError, match="reference"):
        assemble_update(_step([1.0, 0.0], [1, 1]), _algo(beta_kl=0.1), pad_token_id=0)


def _corrections(step, train=True):
    n, width = len(step.rewards), step.rollouts.response_ids.shape[1]
    extra = RolloutBatch.from_lists([[8, 9, 10]] * 2, [[3] * 6, [4] * 2], [[-0.5] * 6, [-0.5] * 2], [True, True],
                                    [11, 12], [0, 0], pad_token_id=0)
    return Corrections(
        rewards=torch.tensor([math.nan, 1.0, math.nan, math.nan]),  # row 1 (wrong) corrected
        rewrite=torch.zeros(n, dtype=torch.bool), kept_mask=torch.zeros(n, width, dtype=torch.bool),
        distance=torch.full((n,), math.nan), alpha=0.6,
        train_batch=extra if train else None, train_rewards=torch.tensor([1.0, 0.0]) if train else None,
        train_source=torch.tensor([1, 1]) if train else None,
    )


def test_ibpo_shaping_composes_and_correction_samples_are_whitened_with_the_rollouts():
    step = _step([1.0, 0.0, 0.0, 0.0], lengths=[3, 3, 2, 4], logp=-1.0)
    step.corrections = _corrections(step)
    reference, calls = _reference(shift=0.1)
    ibpo = IBPOConfig(variant="plain", lam=0.6, beta=0.5)
    assemble_update(step, _algo(beta_kl=0.2, ibpo=ibpo), pad_token_id=0, reference_logprobs=reference)
    # the shaped reward (0 + 0.6 * 0.5 = 0.3) is row 1's outcome reward, on its last token
    assert step.shaped_rewards.tolist() == pytest.approx([1.0, 0.3, 0.0, 0.0])
    update = step.update
    assert calls == [6] and len(update.batch) == 6  # one reference pass over rollouts and corrections
    mask = update.batch.response_mask
    assert update.advantages.shape == mask.shape == (6, 6)
    rewards = torch.tensor([1.0, 0.3, 0.0, 0.0, 1.0, 0.0])
    expected = reinforce_plus_plus_advantages(rewards, torch.where(mask, 0.1, 0.0), mask,
                                              TokenAdvantageSettings(kl_coef=0.2))
    torch.testing.assert_close(update.advantages, expected)
    # the KL-only tokens before row 1's last: return 0.3 - 0.02 * (tokens left)
    returns = torch.tensor([0.3 - 0.02 * 3, 0.3 - 0.02 * 2, 0.3 - 0.02])
    assert torch.all(returns.diff() > 0) and torch.all(update.advantages[1, :3].diff() > 0)


def test_truncated_rows_are_masked_after_the_statistics():
    plain = _step([1.0, 0.0, 0.0, 1.0], lengths=[3, 4, 4, 2], finished=[True, False, True, True])
    cut = _step([1.0, 0.0, 0.0, 1.0], lengths=[3, 4, 4, 2], finished=[True, False, True, True])
    assemble_update(plain, _algo(), pad_token_id=0)
    metrics = assemble_update(cut, AlgorithmConfig(advantage_scale=RPP, ibpo=IBPOConfig(variant="none"),
                                                   overlong=OverlongConfig(mask_truncated=True)), pad_token_id=0)
    adv = cut.update.advantages
    assert torch.equal(adv[1], torch.zeros(adv.shape[1])) and metrics["train/masked_truncated"] == 1.0
    assert torch.equal(adv[[0, 2, 3]], plain.update.advantages[[0, 2, 3]])
    assert not cut.update.batch.response_mask[1].any()


def test_token_kl_estimator_of_the_reward():
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    mask = torch.tensor([[True, True]])
    torch.testing.assert_close(token_kl(logp, ref, mask, "k1"), torch.tensor([[0.5, -1.0]]))
    d = ref - logp
    torch.testing.assert_close(token_kl(logp, ref, mask, "k3"), torch.exp(d) - d - 1)


def test_tool_turns_carry_no_kl_reward_and_no_share_of_the_statistics():
    """A rollout's tool-output tokens (``tool_mask``) are not the policy's: zero advantage, no KL
    reward, out of the whitening; the outcome sits on the policy's last token."""
    step = _step([1.0, 0.0, 0.0, 1.0], lengths=[4, 4, 4, 4], logp=-1.0)
    tools = [[False, True, True, False], [False] * 4, [False, False, True, True], [False] * 4]
    step.rollouts.tool_mask = torch.tensor(tools)
    reference, _ = _reference(shift=0.2)
    assemble_update(step, _algo(beta_kl=0.5), pad_token_id=0, reference_logprobs=reference)
    adv, policy = step.update.advantages, step.rollouts.policy_mask
    assert torch.equal(adv[~policy], torch.zeros(int((~policy).sum())))
    expected = reinforce_plus_plus_advantages(step.rewards, torch.where(policy, 0.2, 0.0), policy,
                                              TokenAdvantageSettings(kl_coef=0.5))
    torch.testing.assert_close(adv, expected)
    # row 2's last policy token is its second: the outcome (0) and two KL rewards end there
    assert adv[2, 1] != 0 and adv[2, 2] == 0
