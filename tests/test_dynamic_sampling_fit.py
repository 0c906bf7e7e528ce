"""Dynamic sampling in a real fit on the tiny config (issue 20, item 2): solved prompts are dropped and
the batch refilled from the stream; ``max_steps`` counts updates; every round's generation is in the
compute budget; the logs say how many groups were filtered and how many rounds it took."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from ibpo_lit.__main__ import main

TINY = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.yaml")
# Half the prompts (by their text) are solved by every response: groups with nothing to learn.
# (A module of the test's own, so the run loads both by import path, as a user's would be.)
REWARD = """
import zlib

import lightning as L


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


@pytest.mark.slow
def test_solved_prompts_are_dropped_and_refilled(tmp_path, monkeypatch):
    folder = tmp_path / "reward"
    folder.mkdir()
    (folder / "half_solved.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(folder))
    sys.argv = sys.argv[:1]
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
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["ibpo_lit"]["dynamic_sampling_per_rank"][0]["rounds"] == 0  # saved after an update: none pending
