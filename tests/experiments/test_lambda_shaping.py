"""The machinery of results/lambda_shaping/PROTOCOL.md: ``lambda_0`` against ``lambda_0.6``, only the
shaping differing, on a problem stream that follows the seed.

What is checked:
- On the shipped SmolLM2 base the two arms' configs differ in ``model.algorithm.ibpo.lam`` alone,
  both with the correction callback and ``train_on_corrections`` on; step-matched settings
  (``max_steps``) keep the base's learning-rate schedule and can drop the gradient-variance logger.
- With lambda = 0 the update still holds the correction samples, with the same advantages as at
  lambda = 0.6; only the rollouts' shaped rewards differ (Delta is computed, times 0).
- Through the command line (configs/tiny.yaml as the base, the data module as ``fit`` builds it):
  two seeds draw different first-step problems, two arms at one seed the same ones, and the
  held-out problems are the same for all; each run's ``problem_seed`` is its seed.
Not checked here: a fit of SmolLM2 (hours on this machine; the protocol's runs are the check).
"""
from __future__ import annotations

import copy
import importlib.util
import os
import sys

import pytest
import torch
import yaml

from ibpo_lit.config import AlgorithmConfig, IBPOConfig
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.experiments.arms import ArmSettings, build_arm_config
from ibpo_lit.models.tiny import build_tiny_tokenizer
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.seeds import SEED_ENV
from ibpo_lit.training.assemble import assemble_update
from ibpo_lit.training.step_types import Corrections, ScoredRollouts

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SMOLLM2 = os.path.join(ROOT, "configs", "smollm2_135m_cpu.yaml")
TINY = os.path.join(ROOT, "configs", "tiny.yaml")
STEPS = ArmSettings(max_steps=16, grad_var_every=0, val_every=16)


def _load(path: str) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def _diff(a, b, where=""):
    """Dotted paths where two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for key in sorted(set(a) | set(b)) for d in _diff(a.get(key), b.get(key), f"{where}.{key}")]
    return [] if a == b else [where.lstrip(".")]


def test_on_the_shipped_base_the_arms_differ_in_lambda_alone():
    base = _load(SMOLLM2)
    zero, paper = (build_arm_config(base, arm, 3, STEPS, "/tmp/x") for arm in ("lambda_0", "lambda_0.6"))
    assert _diff(zero, paper) == ["model.algorithm.ibpo.lam"]
    assert (zero["model"]["algorithm"]["ibpo"]["lam"], paper["model"]["algorithm"]["ibpo"]["lam"]) == (0, 0.6)
    for cfg in (zero, paper):
        ibpo = cfg["model"]["algorithm"]["ibpo"]
        assert ibpo["variant"] == "plain" and ibpo.get("train_on_corrections", True)
        assert cfg["model"]["rollout"]["group_size"] == 8
        classes = [cb["class_path"] for cb in cfg["trainer"]["callbacks"]]
        assert "callbacks.CorrectionRollouts" in classes and "callbacks.GradientVarianceLogger" not in classes
        # step-matched: the base's schedule and steps, no budget that could stop one arm first
        assert cfg["trainer"]["max_steps"] == 16 and cfg["model"]["optim"] == base["model"]["optim"]
        assert {"class_path": "callbacks.ComputeBudgetStopper", "init_args": {}} in cfg["trainer"]["callbacks"]
        # the problem stream follows seed_everything: the base pins no data seed
        assert cfg["seed_everything"] == 3 and "seed" not in cfg["data"] and "seed" not in cfg["data"]["arithmetic"]
    # compute-matched settings keep the constant learning rate and the logger
    matched = build_arm_config(base, "lambda_0", 3, ArmSettings(budget_flops=6e13), "/tmp/x")
    assert matched["model"]["optim"]["min_lr_ratio"] == 1.0 and matched["trainer"]["max_steps"] == 100_000
    with pytest.raises(ValueError, match="budget .* or max_steps"):
        build_arm_config(base, "lambda_0", 3, ArmSettings(), "/tmp/x")
    with pytest.raises(ValueError, match="ArmSettings.max_steps"):
        ArmSettings(max_steps=0)


def _step_with_corrections() -> ScoredRollouts:
    # One group of 4: rows 1 and 2 wrong; row 1's correction is right (not a rewrite), row 2's wrong.
    rollouts = RolloutBatch.from_lists([[5, 6]] * 4, [[7, 8]] * 4, [[0.0, 0.0]] * 4, [True] * 4, list(range(4)),
                                       [0] * 4, pad_token_id=0)
    samples = RolloutBatch.from_lists([[9, 9, 9]] * 2, [[7, 7], [8, 8]], [[0.0, 0.0]] * 2, [True] * 2, [10, 11],
                                      [0, 0], pad_token_id=0)
    corrections = Corrections(
        rewards=torch.tensor([float("nan"), 1.0, 0.0, float("nan")]), rewrite=torch.zeros(4, dtype=torch.bool),
        kept_mask=torch.tensor([[False, False], [True, False], [True, True], [False, False]]),
        distance=torch.tensor([float("nan"), 0.5, 0.0, float("nan")]), alpha=0.6,
        train_batch=samples, train_rewards=torch.tensor([1.0, 0.0]), train_source=torch.tensor([1, 2]))
    return ScoredRollouts(prompts=[Prompt([5, 6], "p", "1")], rollouts=rollouts, texts=[""] * 4,
                          rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]), step=0, corrections=corrections)


def test_lambda_0_still_trains_the_corrections_and_changes_only_the_shaping():
    zero, paper = _step_with_corrections(), _step_with_corrections()
    assemble_update(zero, AlgorithmConfig(ibpo=IBPOConfig(variant="plain", lam=0.0)), pad_token_id=0)
    assemble_update(paper, AlgorithmConfig(ibpo=IBPOConfig(variant="plain", lam=0.6)), pad_token_id=0)
    # Delta is computed in both (0.5 on row 1); lambda = 0 leaves the rewards as the verifier gave them
    assert zero.delta.tolist() == paper.delta.tolist() == [0.0, 0.5, 0.0, 0.0]
    assert zero.shaped_rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert paper.shaped_rewards.tolist() == pytest.approx([1.0, 0.3, 0.0, 1.0])
    # both updates hold the 4 rollouts and the 2 correction samples; the samples' advantages are equal
    assert len(zero.update.batch) == len(paper.update.batch) == 6
    assert torch.equal(zero.update.advantages[4:], paper.update.advantages[4:])
    assert zero.update.advantages[4] > 0 > zero.update.advantages[5]
    assert not torch.allclose(zero.update.advantages[:4], paper.update.advantages[:4])


def _compare():
    spec = importlib.util.spec_from_file_location("compare_script", os.path.join(ROOT, "scripts", "compare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_run_seed(monkeypatch):
    """A fresh process has no run seed; Lightning's seed_everything writes one into os.environ."""
    monkeypatch.delenv(SEED_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


def test_the_problem_stream_follows_the_seed_and_is_shared_by_the_arms(tmp_path, no_run_seed):
    from ibpo_lit.__main__ import main

    base = _load(TINY)
    compare = _compare()

    def drawn(arm: str, seed: int) -> tuple[list[str], list[str]]:
        cfg = build_arm_config(copy.deepcopy(base), arm, seed, STEPS, str(tmp_path / f"{arm}_{seed}"))
        assert compare.problem_seed(cfg) == seed
        path = tmp_path / f"{arm}_{seed}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        cli = main(["--config", str(path), "--trainer.logger", "false"], run=False)  # what `fit` builds
        dm = cli.datamodule
        dm.tokenizer_obj = build_tiny_tokenizer()
        dm.setup("fit")
        first = [p.problem for p in next(iter(dm.train_dataloader()))]
        return first, [p.problem for p in dm.val_prompts()]

    zero_1, held_1 = drawn("lambda_0", 1)
    paper_1, held_paper = drawn("lambda_0.6", 1)
    zero_2, held_2 = drawn("lambda_0", 2)
    assert zero_1 == paper_1  # paired: one seed, one problem stream for both arms
    assert zero_1 != zero_2  # seeds differ in their problems
    assert held_1 == held_paper == held_2 and held_1  # the held-out set is fixed
    # a base that pins the arithmetic seed pins the stream, and the summary would say so
    assert compare.problem_seed({"seed_everything": 2, "data": {"arithmetic": {"seed": 0}}}) == 0
