"""RolloutSamples: on a real tiny fit, the kept rollouts are the step's own (texts, rewards,
shaped rewards), at the right steps, in samples.jsonl and in TensorBoard's text tab."""
from __future__ import annotations

import json
import os
import sys

import pytest
from lightning.pytorch.callbacks import Callback

from callbacks.rollout_samples import RolloutSamples, markdown_table
from ibpo_lit.__main__ import main

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")


class Spy(Callback):
    """Keeps each step's texts and rewards as the module handed them to callbacks."""

    def __init__(self):
        self.steps = {}

    def on_before_update(self, trainer, pl_module, step):
        self.steps[step.step] = (list(step.texts), step.rewards.tolist(), step.shaped_rewards.tolist(),
                                 step.rollouts.group_index.tolist(), [p.uid for p in step.prompts])


def test_samples_are_the_steps_own_rollouts(tmp_path):
    sys.argv = sys.argv[:1]
    cli = main(["--config", TINY, "--trainer.max_steps", "5", "--trainer.default_root_dir", str(tmp_path),
                "--trainer.enable_progress_bar", "false", "--model.rollout.sampling.max_new_tokens", "8"], run=False)
    spy = Spy()
    cli.trainer.callbacks += [RolloutSamples(every_n_steps=2, num_prompts=1, per_group=2), spy]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)

    path = os.path.join(cli.trainer.log_dir, "samples.jsonl")
    records = [json.loads(line) for line in open(path)]
    assert sorted({r["step"] for r in records}) == [0, 2, 4]  # every 2nd step, the first included
    for step in (0, 2, 4):
        texts, rewards, shaped, group, uids = spy.steps[step]
        kept = [r for r in records if r["step"] == step]
        rows = [i for i, g in enumerate(group) if g == 0][:2]  # first prompt, first 2 responses
        assert [r["response"] for r in kept] == [texts[i] for i in rows]
        assert [r["reward"] for r in kept] == [rewards[i] for i in rows]
        assert [r["shaped_reward"] for r in kept] == pytest.approx([shaped[i] for i in rows])
        assert all(r["uid"] == uids[0] and r["gold"] and r["problem"] for r in kept)
        # The prompt as the policy saw it: the chat template around the problem and the instruction.
        assert all(r["problem"] in r["prompt"] and "####" in r["prompt"] and r["prompt"] != r["problem"] for r in kept)
        assert all("correction_reward" in r for r in kept)  # tiny.yaml runs IBPO's corrections

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(cli.trainer.log_dir, size_guidance={"tensors": 0})
    acc.Reload()
    assert [e.step for e in acc.Tensors("samples/text_summary")] == [0, 2, 4]  # before each step's update


def test_markdown_escapes_cells_and_arguments_are_checked():
    table = markdown_table([{"uid": "a:1", "gold": "5", "reward": 1.0, "shaped_reward": None, "response": "x | y\n#### 5"}])
    assert table.splitlines()[2] == "| a:1 | 5 | 1.0 |  | x \\| y<br>#### 5 |"
    with pytest.raises(ValueError, match="every_n_steps"):
        RolloutSamples(every_n_steps=0)
