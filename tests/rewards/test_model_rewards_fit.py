"""A short ``fit`` (configs/tiny.yaml, the tiny built-in policy) whose reward is math plus a reward
model and a judge made in code: each is logged as ``reward/<name>``, ``train/reward`` is their
weighted sum, and a policy judge of weight 0 is asked without changing the reward."""
from __future__ import annotations

import glob
import json
import os
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ibpo_lit.__main__ import main

from model_reward_fixtures import save_constant_judge, save_tiny_reward_model

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")


def fit(root, rewards: list[dict], steps: int = 2):
    sys.argv = sys.argv[:1]  # LightningCLI warns when it sees pytest's own arguments
    return main(["fit", "--config", TINY, "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root),
                 "--trainer.enable_progress_bar", "false", "--model.rewards", json.dumps(rewards)])


def scalars(root) -> dict[str, list[float]]:
    (events,) = glob.glob(os.path.join(str(root), "lightning_logs", "version_0", "events.out.tfevents.*"))
    acc = EventAccumulator(events)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
@pytest.mark.usefixtures("one_intra_op_thread")
def test_fit_with_math_a_reward_model_and_a_judge(tmp_path):
    rm = save_tiny_reward_model(tmp_path / "tiny-rm")
    judge = save_constant_judge(tmp_path / "judge-model", reply="1")
    cli = fit(tmp_path / "run", [
        {"name": "math"},
        {"name": f"reward_model:{rm}", "weight": 0.5},
        {"name": "judge:correctness", "weight": 0.5,
         "options": {"model": str(judge), "parser": "score_0_1", "max_new_tokens": 1}},
    ])
    assert cli.trainer.global_step == 2
    logged = scalars(tmp_path / "run")
    assert len(logged["reward/math"]) == 2 and len(logged["reward/tiny-rm"]) == 2
    assert logged["reward/judge_correctness"] == [1.0, 1.0]  # the constant judge says "1" to everything
    for step in range(2):  # the mean of the weighted sums is the weighted sum of the means (all scored)
        expected = logged["reward/math"][step] + 0.5 * logged["reward/tiny-rm"][step] + 0.5 * 1.0
        assert logged["train/reward"][step] == pytest.approx(expected, abs=1e-4)
    assert logged["train/unscorable"] == [0.0, 0.0]
    assert all(v != 0.0 for v in logged["reward/tiny-rm"])


@pytest.mark.slow
@pytest.mark.usefixtures("one_intra_op_thread")
def test_fit_with_the_policy_as_a_logged_judge(tmp_path):
    cli = fit(tmp_path / "run", [{"name": "math"},
                                 {"name": "judge:correctness", "weight": 0.0, "options": {"max_new_tokens": 4}}],
              steps=1)
    assert cli.trainer.global_step == 1
    logged = scalars(tmp_path / "run")
    assert "reward/math" in logged and "train/reward" in logged
    # the random policy's replies are no YES/NO: the judge's minimum, counted as penalized, not
    # unscorable; math unaffected
    assert logged["reward/judge_correctness_penalized"][0] > 0 and logged["reward/judge_correctness"][0] == 0.0
    assert logged["train/reward_none"] == [0.0] and logged["train/unscorable"] == [0.0]


@pytest.mark.slow
def test_two_fsdp2_processes_score_with_a_sharded_reward_model_and_judges(tmp_path, monkeypatch):
    """configs/tiny_fsdp.yaml (2 processes, FSDP2, corrections on): the reward model and the
    separate judge are sharded, the policy judges through its sharded HF engine. Rank 0 has
    corrections to score and rank 1 none (`CorrectionsOnRankZeroOnly`): scoring, a collective
    here, still runs on both (a rank that skipped it would leave the other waiting, or pair its
    collectives with the wrong ones), and the run ends, logging each reward."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scale"))
    from fit_runs import CORRECTIONS, callbacks, run_fit

    monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.abspath(__file__)))  # the callback's module

    rm = save_tiny_reward_model(tmp_path / "tiny-rm")
    judge = save_constant_judge(tmp_path / "judge-model", reply="1")
    (tmp_path / "says_one.txt").write_text("Problem: {problem}\nAnswer: {response}\nScore from 0 to 1:")
    rewards = [
        {"name": "math"},
        {"name": f"reward_model:{rm}", "weight": 0.5, "options": {"batch_size": 3}},
        {"name": f"judge:{tmp_path / 'says_one.txt'}", "weight": 0.5,
         "options": {"model": str(judge), "parser": "score_0_1", "max_new_tokens": 1}},
        {"name": "judge:correctness", "weight": 0.0, "options": {"max_new_tokens": 3}},
    ]
    root = tmp_path / "run"
    run_fit("tiny_fsdp.yaml", root, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
            "--model.rewards", json.dumps(rewards),
            "--trainer.callbacks", callbacks({"class_path": "model_reward_fixtures.CorrectionsOnRankZeroOnly"}, CORRECTIONS))
    logged = scalars(root)
    assert logged["reward/judge_says_one"] == [1.0, 1.0] and logged["reward/judge_says_one_penalized"] == [0.0, 0.0]
    assert len(logged["reward/tiny-rm"]) == 2 and len(logged["reward/math"]) == 2
    assert logged["train/unscorable"] == [0.0, 0.0]
    assert all(n > 0 for n in logged["train/corrections"])  # rank 0's (summed over ranks)
