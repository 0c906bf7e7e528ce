"""CorrectionRollouts inside real training steps on the tiny model: what it hands the
module, checked against independent recomputation, and the shaping the module applies."""
from __future__ import annotations

import math
import os
import sys

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from callbacks.correction import CorrectionRollouts
from ibpo_lit.__main__ import main
from ibpo_lit.algorithms.edit_alignment import (
    is_full_rewrite,
    kept_positions,
    normalized_edit_distance,
)
from ibpo_lit.module import IBPOModule
from ibpo_lit.rewards import math_score
from ibpo_lit.training.corrections import choose_references

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")
STEPS = 14


class Spy(Callback):
    """Placed after CorrectionRollouts, so it sees each step with its corrections."""

    def __init__(self):
        self.steps = []

    def on_rollouts_scored(self, trainer, pl_module, step):
        self.steps.append(step)


def fit_with_spy(root, config=TINY, steps=STEPS):
    """Fit the tiny model for ``steps`` steps; returns the CLI, the correction callback, every
    step the spy saw and the metrics the module logged at each."""
    sys.argv = sys.argv[:1]
    cli = main(
        ["--config", str(config), "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root),
         "--trainer.enable_progress_bar", "false"],
        run=False,
    )
    spy = Spy()
    cli.trainer.callbacks.append(spy)
    logged = []
    original = IBPOModule._log_metrics

    def record(self, metrics):
        logged.append(dict(metrics))
        original(self, metrics)

    IBPOModule._log_metrics = record
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    finally:
        IBPOModule._log_metrics = original
    callback = next(cb for cb in cli.trainer.callbacks if isinstance(cb, CorrectionRollouts))
    return cli, callback, spy.steps, logged


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return fit_with_spy(tmp_path_factory.mktemp("flow"))


def test_corrections_match_an_independent_recomputation(run):
    cli, callback, steps, _ = run
    assert len(steps) == STEPS
    seed = cli.model.rollout_cfg.seed
    for step in steps:
        c = step.corrections
        rewards = step.rewards.tolist()
        groups = step.rollouts.group_index.tolist()
        responses = step.rollouts.response_lists()
        pairs = choose_references(rewards, groups, seed, step.step)
        assert len(pairs) == sum(r == 0 for r in rewards) - 0  # every wrong row has a partner at G=8
        corrected = c.train_batch.response_lists()
        texts = cli.model.tokenizer.batch_decode(corrected, skip_special_tokens=True)
        for m, (i, ref) in enumerate(pairs):
            assert groups[ref] == groups[i] and ref != i
            if any(rewards[j] == 1 for j in range(len(rewards)) if groups[j] == groups[i]):
                assert rewards[ref] == 1  # a correct reference whenever the group has one
            y_hat = corrected[m]
            assert c.rewards[i].item() == math_score(texts[m], step.prompts[groups[i]].gold)
            assert c.distance[i].item() == pytest.approx(normalized_edit_distance(responses[i], y_hat))
            kept = kept_positions(responses[i], y_hat)
            assert c.kept_mask[i, : len(kept)].tolist() == kept and not c.kept_mask[i, len(kept) :].any()
            if c.rewards[i] == 1:
                assert bool(c.rewrite[i]) == is_full_rewrite(responses[i], y_hat, responses[ref], 0.6)
            assert c.train_batch.group_index[m].item() == groups[i]  # grouped by original prompt
        corrected_rows = {i for i, _ in pairs}
        assert all(math.isnan(c.rewards[i]) for i in range(len(rewards)) if i not in corrected_rows)


def test_module_shapes_successful_local_corrections(run):
    cli, _, steps, logged = run
    lam, beta = cli.model.algorithm.ibpo.lam, cli.model.algorithm.ibpo.beta
    shaped_steps = 0
    for step, metrics in zip(steps, logged):
        c = step.corrections
        bonus = (step.rewards == 0) & (c.rewards == 1) & ~c.rewrite
        expected = step.rewards + lam * beta * bonus.float()  # plain IBPO: r + lambda * beta
        assert metrics["train/shaped_reward"] == pytest.approx(expected.mean().item())
        shaped_steps += int(bonus.any())
        n_success = int(((c.rewards == 1)).sum())
        if n_success:
            assert metrics["train/rewrite_rate"] == pytest.approx(int((c.rewrite & (c.rewards == 1)).sum()) / n_success)
    assert shaped_steps > 0, f"no shaped rollout in {STEPS} steps: the test exercised nothing"


def test_k1_corrects_every_wrong_rollout_alone_and_filters_on_distance_only(tmp_path, one_intra_op_thread):
    """``reference: none`` through a YAML config: each wrong row gets one self-revision, its
    prompt shows no second candidate, and the rewrite flag is ``d(y_i, y^) > alpha``."""
    cfg = yaml.safe_load(open(TINY))
    cfg["model"]["algorithm"]["ibpo"]["reference"] = "none"
    path = tmp_path / "k1.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cli, callback, steps, logged = fit_with_spy(tmp_path / "run", config=path, steps=4)
    assert callback.corrector.cfg.reference == "none" and len(steps) == 4
    lam, beta = cli.model.algorithm.ibpo.lam, cli.model.algorithm.ibpo.beta
    corrected_any = False
    for step, metrics in zip(steps, logged):
        c = step.corrections
        rewards = step.rewards.tolist()
        wrong = [i for i, r in enumerate(rewards) if r == 0]
        assert [i for i in range(len(rewards)) if not math.isnan(c.distance[i])] == wrong
        if not wrong:
            continue
        corrected_any = True
        assert len(c.train_batch) == len(wrong)  # one correction per wrong row, none for the others
        responses = step.rollouts.response_lists()
        corrected = c.train_batch.response_lists()
        prompt = cli.model.tokenizer.decode(c.train_batch.prompt_lists()[0], skip_special_tokens=True)
        assert "Candidate solution:" in prompt and "Candidate solution 2" not in prompt
        for m, i in enumerate(wrong):
            d = normalized_edit_distance(responses[i], corrected[m])
            assert c.distance[i].item() == pytest.approx(d)
            assert bool(c.rewrite[i]) == (c.rewards[i].item() == 1 and d > 0.6)
        bonus = (step.rewards == 0) & (c.rewards == 1) & ~c.rewrite
        assert metrics["train/shaped_reward"] == pytest.approx((step.rewards + lam * beta * bonus.float()).mean().item())
    assert corrected_any, "no wrong rollout in 4 steps: the test exercised nothing"


def test_removing_the_callback_turns_corrections_off(tmp_path):
    sys.argv = sys.argv[:1]
    cli = main(["--config", TINY, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path),
                "--trainer.enable_progress_bar", "false", "--trainer.callbacks", "[]", "--model.algorithm.ibpo.variant", "none"],
               run=False)
    spy = Spy()
    cli.trainer.callbacks.append(spy)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert len(spy.steps) == 2 and all(s.corrections is None for s in spy.steps)
    assert torch.isfinite(torch.tensor(cli.trainer.logged_metrics["train/loss"]))
