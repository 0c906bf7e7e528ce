"""Overlong handling in the assembled update (issue 20, item 3): truncated responses masked out of
the loss, and DAPO's soft penalty added after IBPO's shaping (which reads the verifier's 0/1)."""
import math

import pytest
import torch

from ibpo_lit.config import AlgorithmConfig, IBPOConfig, OverlongConfig
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.assemble import assemble_update
from ibpo_lit.training.step_types import ScoredRollouts


def _step(rewards, lengths, finished):
    n = len(rewards)
    batch = RolloutBatch.from_lists([[5, 6]] * n, [[7] * length for length in lengths],
                                    [[0.0] * length for length in lengths], finished, list(range(n)), [0] * n,
                                    pad_token_id=0)
    return ScoredRollouts(prompts=[Prompt([5, 6], "p", "1")], rollouts=batch, texts=[""] * n,
                          rewards=torch.tensor(rewards), step=0)


def _algo(**overlong):
    return AlgorithmConfig(ibpo=IBPOConfig(variant="none"), overlong=OverlongConfig(**overlong))


def test_truncated_rows_leave_the_loss_but_not_the_group_statistics():
    step = _step([1.0, 0.0, 0.0, 1.0], lengths=[3, 10, 4, 10], finished=[True, False, True, False])
    plain = _step([1.0, 0.0, 0.0, 1.0], lengths=[3, 10, 4, 10], finished=[True, False, True, False])
    assemble_update(plain, _algo(), pad_token_id=0)
    metrics = assemble_update(step, _algo(mask_truncated=True), pad_token_id=0)
    update = step.update
    assert update.advantages[[1, 3]].tolist() == [0.0, 0.0]
    # the others keep the advantages computed with every row in the group (TRL's order)
    assert torch.equal(update.advantages[[0, 2]], plain.update.advantages[[0, 2]])
    assert not update.batch.response_mask[[1, 3]].any() and update.batch.response_mask[0, :3].all()
    assert metrics["train/masked_truncated"] == 2.0
    assert step.rollouts.response_mask[1].sum() == 10  # the rollouts themselves are untouched


def test_soft_penalty_after_shaping_from_max_new_tokens():
    step = _step([1.0, 0.0, 1.0, 0.0], lengths=[2, 7, 9, 10], finished=[True, True, True, False])
    metrics = assemble_update(step, _algo(soft_buffer=4, soft_factor=0.5), pad_token_id=0, max_new_tokens=10)
    # free up to 6 tokens; 7 -> -0.5 * 1/4, 9 -> -0.5 * 3/4, 10 -> -0.5
    assert step.shaped_rewards.tolist() == pytest.approx([1.0, -0.125, 1.0 - 0.375, -0.5])
    assert metrics["train/overlong_penalty"] == pytest.approx(-(0.125 + 0.375 + 0.5) / 4)
    assert metrics["train/reward"] == 0.5  # the verifier's reward is reported as it was
    with pytest.raises(ValueError, match="max_new_tokens"):
        assemble_update(_step([1.0, 0.0], [1, 1], [True, True]), _algo(soft_buffer=4), pad_token_id=0)


def test_bad_overlong_settings():
    with pytest.raises(ValueError, match="soft_buffer"):
        OverlongConfig(soft_buffer=0)
    with pytest.raises(ValueError, match="soft_factor"):
        OverlongConfig(soft_factor=-1.0)
    assert math.isfinite(OverlongConfig().soft_factor)
