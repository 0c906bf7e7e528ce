"""Dynamic sampling in a real fit on the tiny config (issue 20, item 2): solved prompts are dropped and
the batch refilled from the stream; ``max_steps`` counts updates; every round's generation is in the
compute budget; the logs say how many groups were filtered and how many rounds it took.

An update whose rounds reach ``max_rounds`` short of informative groups is not silent (issue 30,
item 8): one WARNING line per such update on rank 0, saying how many were found, what the update
trains and what to change, and ``train/missing_groups``; an update that found enough says nothing."""
from __future__ import annotations

import json
import logging
import os
import sys

import pytest
import torch

from ibpo_lit.__main__ import main
from ibpo_lit.training.group_filter import InformativeGroups, shortfall_message

TINY = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.yaml")
# Half the prompts (by their text) are solved by every response: groups with nothing to learn.
# (A module of the test's own, so the run loads both by import path, as a user's would be.)
REWARD = """
import zlib

import lightning as L


def always_right(prompts, completions, **columns):
    return [1.0] * len(completions)


def half_solved(prompts, completions, **columns):
    return [1.0 if zlib.crc32(p.encode()) % 2 else float(zlib.crc32(c.encode()) % 2)
            for p, c in zip(prompts, completions)]


class Rounds(L.Callback):
    # Counts what each generation round sampled, and the groups each update trained.
    def __init__(self):
        self.generated, self.rounds, self.trained = 0, 0, []

    def on_rollouts_scored(self, trainer, pl_module, step):
        self.generated += int(step.rollouts.response_mask.sum())
        self.rounds += 1

    def on_before_update(self, trainer, pl_module, step):
        self.trained.append(step.rewards.view(len(step.prompts), -1))
"""


SHORT = "ibpo_lit.training.group_filter"  # the logger of the shortfall's warning


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    folder = tmp_path / "reward"
    folder.mkdir()
    (folder / "half_solved.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


def _shortfalls(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SHORT and r.levelno == logging.WARNING]


@pytest.mark.slow
def test_solved_prompts_are_dropped_and_refilled(tmp_path, reward_module, caplog):
    caplog.set_level(logging.WARNING, logger=SHORT)
    cli = main(["fit", "--config", TINY, "--trainer.max_steps", "3", "--trainer.default_root_dir", str(tmp_path / "run"),
                "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
                "--model.reward", "half_solved:half_solved", "--model.algorithm.ibpo.variant", "none",
                "--trainer.callbacks", json.dumps([{"class_path": "half_solved.Rounds"},
                                                   {"class_path": "callbacks.ComputeBudgetStopper"}]),
                "--model.algorithm.dynamic_sampling.enabled", "true",
                "--model.algorithm.dynamic_sampling.max_rounds", "4", "--data.prompts_per_step", "2"],
               )
    module, trainer = cli.model, cli.trainer
    rounds = next(c for c in trainer.callbacks if type(c).__name__ == "Rounds")
    budget = next(c for c in trainer.callbacks if type(c).__name__ == "ComputeBudgetStopper")
    assert trainer.global_step == 3  # updates
    assert rounds.rounds == module.rollout_step > 3  # refilled: more rounds than updates
    assert budget.generated_tokens == rounds.generated  # the dropped rounds' generation is paid for
    for rewards in rounds.trained:  # every trained group has something to learn
        assert len(rewards) == 2
        assert all(row.min() < row.max() for row in rewards)
    logged = trainer.logged_metrics
    assert float(logged["train/trained_groups"]) == 2
    assert float(logged["train/missing_groups"]) == 0 and _shortfalls(caplog) == []  # enough found: no warning
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["ibpo_lit"]["dynamic_sampling_per_rank"][0]["rounds"] == 0  # saved after an update: none pending


@pytest.mark.slow
def test_no_informative_group_at_the_cap_warns_once_per_update(tmp_path, reward_module, caplog):
    caplog.set_level(logging.WARNING, logger=SHORT)
    cli = main(["fit", "--config", TINY, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path / "run"),
                "--trainer.enable_progress_bar", "false", "--trainer.logger", "false", "--trainer.callbacks", "[]",
                "--model.reward", "half_solved:always_right", "--model.algorithm.ibpo.variant", "none",
                "--model.algorithm.dynamic_sampling.enabled", "true",
                "--model.algorithm.dynamic_sampling.max_rounds", "2", "--data.prompts_per_step", "2"])
    assert cli.trainer.global_step == 2 and cli.model.rollout_step == 4  # 2 updates of 2 rounds each
    assert _shortfalls(caplog) == [
        "dynamic sampling: 0 informative groups in 2 round(s) (in every group the rewards were all equal, e.g. all "
        "right or all wrong, or unscorable); this update trains on nothing. Raise "
        "model.algorithm.dynamic_sampling.max_rounds, make the task harder or easier for the model, or turn dynamic "
        "sampling off"] * 2
    logged = cli.trainer.logged_metrics
    assert float(logged["train/missing_groups"]) == 2 and float(logged["train/trained_groups"]) == 0


def test_fewer_informative_groups_than_wanted_warn_on_rank_zero_only(caplog):
    from test_group_filter import IBPO, _step  # (tests/ is on sys.path: that file's step builder)

    from ibpo_lit.scale.collectives import RankSync
    from ibpo_lit.training.assemble import assemble_update

    caplog.set_level(logging.WARNING, logger=SHORT)
    for rank, warned in ((1, 0), (0, 1)):
        groups = InformativeGroups(2)
        for s, rewards in enumerate(([1, 1, 1, 1], [1, 0, 1, 1])):  # 2 prompts a round: 1 informative in 2 rounds
            step = _step(rewards, step=s)
            assemble_update(step, IBPO, pad_token_id=0)
            update = groups.add(step, {}, RankSync(), rank=rank, pad_token_id=0)
        assert [p.uid for p in update.prompts] == ["p1-0"]
        assert groups.metrics()["train/missing_groups"] == 1
        assert len(_shortfalls(caplog)) == warned
    assert _shortfalls(caplog) == [shortfall_message(1, 2, 2, 1)]
    assert _shortfalls(caplog)[0].startswith("dynamic sampling: 1 informative group(s) of 2 wanted in 2 round(s) (the "
                                             "others' rewards were all equal); this update trains on those 1. Raise "
                                             "model.algorithm.dynamic_sampling.max_rounds")
    # fewer than processes: the last round is trained as it is
    assert "fewer than the 4 processes; this update trains on the last round as it is" in shortfall_message(3, 8, 4, 4)
