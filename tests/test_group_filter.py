"""Dynamic sampling's pieces (issue 20, item 2): which groups are informative (a group IBPO shaped
counts), cutting and joining steps with their corrections, and the refill decision."""
import math

import pytest
import torch

from ibpo_lit.config import AlgorithmConfig, DynamicSamplingConfig, IBPOConfig
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.scale.collectives import RankSync
from ibpo_lit.training.assemble import assemble_update
from ibpo_lit.training.group_filter import InformativeGroups, concat_steps, informative_groups, select_groups
from ibpo_lit.training.step_types import Corrections, ScoredRollouts

G = 2
IBPO = AlgorithmConfig(ibpo=IBPOConfig(variant="plain", lam=0.6, beta=0.5))


def _step(rewards, step=0, corrected=None):
    """One step of len(rewards) / G prompts; ``corrected``: {row: (correction reward, sample rewards)}
    gives those wrong rows a (non-rewrite) correction and correction samples trained jointly."""
    n = len(rewards)
    lengths = [2 + (i % 3) for i in range(n)]
    batch = RolloutBatch.from_lists([[5] * (1 + i % 2) for i in range(n)], [[7 + i] * k for i, k in enumerate(lengths)],
                                    [[-0.1 * i] * k for i, k in enumerate(lengths)], [True] * n, list(range(n)),
                                    [i // G for i in range(n)], pad_token_id=0)
    prompts = [Prompt([5], "problem", "1", uid=f"p{step}-{p}") for p in range(n // G)]
    out = ScoredRollouts(prompts=prompts, rollouts=batch, texts=[f"t{step}-{i}" for i in range(n)],
                         rewards=torch.tensor(rewards, dtype=torch.float32), step=step)
    if corrected is not None:
        width = batch.response_ids.shape[1]
        c = Corrections(rewards=torch.full((n,), math.nan), rewrite=torch.zeros(n, dtype=torch.bool),
                        kept_mask=torch.zeros(n, width, dtype=torch.bool), distance=torch.full((n,), math.nan),
                        alpha=0.6)
        sources, sample_rewards = [], []
        for row, (reward, samples) in corrected.items():
            c.rewards[row], c.distance[row] = reward, 0.2
            c.kept_mask[row, :2] = True
            sources += [row] * len(samples)
            sample_rewards += samples
        c.train_batch = RolloutBatch.from_lists([[9]] * len(sources), [[3, 4]] * len(sources), [[0.0, 0.0]] * len(sources),
                                                [True] * len(sources), list(range(len(sources))),
                                                [r // G for r in sources], pad_token_id=0)
        c.train_rewards = torch.tensor(sample_rewards, dtype=torch.float32)
        c.train_source = torch.tensor(sources)
        out.corrections = c
    return out


def test_a_group_is_informative_when_one_of_its_rows_trains():
    # groups: mixed | all right | all wrong | all wrong, one correction shaped it
    step = _step([1, 0, 1, 1, 0, 0, 0, 0], corrected={1: (1.0, [1.0]), 4: (0.0, [0.0]), 6: (1.0, [1.0])})
    assemble_update(step, IBPO, pad_token_id=0)
    assert informative_groups(step).tolist() == [True, False, False, True]
    # without IBPO the all-wrong group has no gradient
    plain = _step([1, 0, 1, 1, 0, 0, 0, 0])
    assemble_update(plain, AlgorithmConfig(ibpo=IBPOConfig(variant="none")), pad_token_id=0)
    assert informative_groups(plain).tolist() == [True, False, False, False]
    # correction samples count: an unshaped all-wrong group whose samples differ trains through them
    samples = _step([0, 0, 1, 1], corrected={0: (0.0, [1.0, 0.0])})
    assemble_update(samples, IBPO, pad_token_id=0)
    assert informative_groups(samples).tolist() == [True, False]


def test_cut_and_joined_steps_keep_each_groups_advantages_and_corrections():
    a = _step([1, 0, 1, 1, 0, 0, 0, 0], step=0, corrected={1: (1.0, [1.0]), 4: (0.0, [0.0]), 6: (1.0, [0.0])})
    b = _step([0, 0, 1, 0], step=1, corrected={0: (1.0, [1.0]), 1: (0.0, [0.0]), 3: (0.0, [1.0])})
    for s in (a, b):
        assemble_update(s, IBPO, pad_token_id=0)
    joined = concat_steps([select_groups(a, [3, 0]), select_groups(b, [1])], pad_token_id=0)
    assemble_update(joined, IBPO, pad_token_id=0)
    assert [p.uid for p in joined.prompts] == ["p0-3", "p0-0", "p1-1"]
    assert joined.texts == ["t0-6", "t0-7", "t0-0", "t0-1", "t1-2", "t1-3"]
    assert joined.rollouts.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert joined.step == 1
    rows = {0: [6, 7], 1: [0, 1], 2: [2, 3]}
    expected = torch.cat([a.update.advantages[rows[0]], a.update.advantages[rows[1]], b.update.advantages[rows[2]]])
    assert torch.allclose(joined.update.advantages[:6], expected)
    assert torch.equal(joined.shaped_rewards, torch.cat([a.shaped_rewards[[6, 7, 0, 1]], b.shaped_rewards[[2, 3]]]))
    # token ids and masks survive the re-padding
    assert joined.rollouts.response_lists() == [a.rollouts.response_lists()[i] for i in (6, 7, 0, 1)] + \
        [b.rollouts.response_lists()[i] for i in (2, 3)]
    # correction samples follow the rows they correct, grouped by their new prompt
    c = joined.corrections
    assert c.train_source.tolist() == [0, 3, 5]
    assert c.train_batch.group_index.tolist() == [0, 1, 2]
    assert c.train_rewards.tolist() == [0.0, 1.0, 1.0]
    assert torch.equal(c.kept_mask[[0, 3, 5]].any(dim=1), torch.tensor([True, True, True]))
    assert c.rewards[[0, 3, 5]].tolist() == [1.0, 1.0, 0.0]


def _filter(max_rounds=3):
    return InformativeGroups(max_rounds)


def test_the_batch_is_refilled_until_it_holds_the_configured_groups():
    groups, sync = _filter(), RankSync()
    # 2 prompts per step: round 0 has one informative group, round 1 two (one is surplus)
    first = _step([1, 1, 1, 0], step=0)
    assemble_update(first, IBPO, pad_token_id=0)
    assert groups.add(first, {"train/reward": 0.75, "train/unscorable": 0.0}, sync, pad_token_id=0) is None
    second = _step([0, 1, 1, 0], step=1)
    assemble_update(second, IBPO, pad_token_id=0)
    update = groups.add(second, {"train/reward": 0.5, "train/unscorable": 1.0}, sync, pad_token_id=0)
    assert [p.uid for p in update.prompts] == ["p0-1", "p1-0"]  # the first two, in order; p1-1 dropped
    metrics = groups.metrics()
    assert metrics["train/generation_rounds"] == 2 and metrics["train/filtered_groups"] == 1
    assert metrics["train/informative_groups"] == 3 and metrics["train/trained_groups"] == 2
    assert metrics["train/reward"] == pytest.approx(0.625) and metrics["train/unscorable"] == 1.0  # mean, sum
    assert groups.rounds == 0 and not groups.kept  # reset for the next update


def test_the_cap_trains_what_was_found_and_an_empty_cap_the_last_round():
    groups = _filter(max_rounds=2)
    for s, rewards in enumerate(([1, 1, 1, 1], [1, 0, 0, 0])):
        step = _step(rewards, step=s)
        assemble_update(step, IBPO, pad_token_id=0)
        update = groups.add(step, {}, RankSync(), pad_token_id=0)
    assert [p.uid for p in update.prompts] == ["p1-0"]
    assert groups.metrics()["train/trained_groups"] == 1
    for s in range(2):
        last = _step([1, 1, 1, 1], step=s)
        assemble_update(last, IBPO, pad_token_id=0)
        update = groups.add(last, {}, RankSync(), pad_token_id=0)
    assert update is last  # nothing informative at the cap: the last round as it is (no gradient)


def test_rounds_in_progress_survive_a_checkpoint():
    groups = _filter()
    step = _step([1, 0, 1, 1], step=0)
    assemble_update(step, IBPO, pad_token_id=0)
    assert groups.add(step, {"train/reward": 0.75}, RankSync(), pad_token_id=0) is None
    saved = groups.state_dict()
    restored = _filter()
    restored.load_state_dict(torch.load(_roundtrip(saved), weights_only=False))
    nxt = _step([0, 1, 0, 0], step=1)
    assemble_update(nxt, IBPO, pad_token_id=0)
    update = restored.add(nxt, {"train/reward": 0.25}, RankSync(), pad_token_id=0)
    assert [p.uid for p in update.prompts] == ["p0-0", "p1-0"]
    assert restored.metrics()["train/reward"] == pytest.approx(0.5)


def _roundtrip(obj):
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_bad_settings():
    with pytest.raises(ValueError, match="max_rounds"):
        DynamicSamplingConfig(enabled=True, max_rounds=0)
