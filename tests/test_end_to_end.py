"""End-to-end runs of `python -m ibpo_lit fit` on the tiny model built in code."""
from __future__ import annotations

import copy
import glob
import os
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ibpo_lit.__main__ import main
from ibpo_lit.models.tiny import build_tiny_model
from ibpo_lit.training.update import PolicyUpdate

TINY = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.yaml")

REQUIRED_METRICS = [
    "train/reward",
    "train/shaped_reward",
    "train/correction_success",
    "train/rewrite_rate",
    "train/loss",
    "train/clip_frac",
    "train/response_len",
    "train/tokens_per_s",
]


def fit(root, *overrides: str, steps: int = 3):
    sys.argv = sys.argv[:1]  # LightningCLI warns when it sees pytest's own arguments
    args = ["fit", "--config", TINY, "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root)]
    args += ["--trainer.enable_progress_bar", "false", *overrides]
    return main(args)


def scalars(root) -> dict[str, list[float]]:
    (events,) = glob.glob(os.path.join(str(root), "lightning_logs", "version_0", "events.out.tfevents.*"))
    acc = EventAccumulator(events)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    cli = fit(root)
    return root, cli


def test_tiny_config_trains_every_parameter(tiny_run):
    root, cli = tiny_run
    assert cli.trainer.global_step == 3
    initial = build_tiny_model(seed=1)  # the config's model: tiny-llama, rollout.seed 1
    trained = dict(cli.model.policy.named_parameters())
    unchanged = [name for name, p in initial.named_parameters() if torch.equal(p, trained[name].detach())]
    # weight_decay is 0 in the config, so only a real gradient moves a parameter
    assert cli.model.optim_cfg.weight_decay == 0
    assert unchanged == []


def test_tensorboard_holds_the_metrics_and_a_checkpoint_is_written(tiny_run):
    root, _ = tiny_run
    logged = scalars(root)
    missing = [m for m in REQUIRED_METRICS if m not in logged]
    assert missing == []
    assert len(logged["train/reward"]) == 3
    assert all(0.0 <= r <= 1.0 for r in logged["train/reward"])
    assert any(g > 0 for g in logged["train/grad_norm"])  # the run did learn something
    assert os.path.isfile(os.path.join(str(root), "checkpoints", "last.ckpt"))


def _first_gradients(monkeypatch):
    """Capture the accumulated gradients of the first optimizer step that has any."""
    captured = {}
    original = PolicyUpdate.clip_and_check

    def spy(self):
        if not captured and any(p.grad is not None for p in self.policy.parameters()):
            captured.update({n: p.grad.clone() for n, p in self.policy.named_parameters() if p.grad is not None})
        return original(self)

    monkeypatch.setattr(PolicyUpdate, "clip_and_check", spy)
    return captured


def test_gradients_are_freed_after_each_update(tmp_path, monkeypatch):
    held = []
    original = PolicyUpdate.run

    def spy(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        held.append(sum(p.grad is not None for p in self.policy.parameters()))
        return out

    monkeypatch.setattr(PolicyUpdate, "run", spy)
    fit(tmp_path, steps=2)
    assert len(held) == 2 and held == [0, 0]  # none kept into the next step's rollouts
    assert any(g > 0 for g in scalars(tmp_path)["train/grad_norm"])  # there were gradients to free


def test_micro_batching_does_not_change_the_gradient(tmp_path, monkeypatch):
    """Accumulating over micro-batches of 1 response gives the gradient of one micro-batch
    of all responses (each micro-batch loss is a share of the mini-batch loss). Gradients,
    not parameters after AdamW, are compared: Adam normalises each element's step, so
    elements whose gradient is float noise would differ by up to lr in either run."""
    whole = _first_gradients(monkeypatch)
    fit(tmp_path / "whole", "--model.rollout.micro_batch_size", "64")
    monkeypatch.undo()
    ones = _first_gradients(monkeypatch)
    fit(tmp_path / "ones", "--model.rollout.micro_batch_size", "1")
    assert whole, "no step with a gradient in 3 steps: the test exercised nothing"
    assert set(whole) == set(ones)
    for name, grad in whole.items():
        torch.testing.assert_close(ones[name], grad, atol=1e-7, rtol=1e-4, msg=name)
    la, lb = scalars(tmp_path / "whole")["train/loss"], scalars(tmp_path / "ones")["train/loss"]
    assert la == pytest.approx(lb, abs=1e-6)


def test_gradient_matches_an_independent_per_sequence_computation(tmp_path, monkeypatch):
    """The module's gradient of a step, against GSPO's gradient written out by hand for
    each response alone (no padding, no batching, no skipping):
    on-policy s_i = 1, so grad J = (1/N) sum_i A_i * (1/|y_i|) sum_t grad log pi(y_it)."""
    captured = {}
    original_update = PolicyUpdate.run
    original_clip = PolicyUpdate.clip_and_check

    def spy_update(self, update, *args):
        if "batch" not in captured and bool((update.advantages != 0).any()):
            captured.update(batch=update.batch, advantages=update.advantages.clone(), policy=copy.deepcopy(self.policy))
            captured["temperature"] = self.rollout_cfg.sampling.temperature
        return original_update(self, update, *args)

    def spy_clip(self):
        if "batch" in captured and "grads" not in captured:
            captured["grads"] = {n: p.grad.clone() for n, p in self.policy.named_parameters() if p.grad is not None}
        return original_clip(self)

    monkeypatch.setattr(PolicyUpdate, "run", spy_update)
    monkeypatch.setattr(PolicyUpdate, "clip_and_check", spy_clip)
    fit(tmp_path, "--model.algorithm.ibpo.variant", "none", steps=4)
    assert "grads" in captured, "no step with a non-zero advantage in 4 steps"

    batch, adv, model, T = captured["batch"], captured["advantages"], captured["policy"], captured["temperature"]
    model.zero_grad()
    n = len(batch)
    objective = 0.0
    for prompt, response, a in zip(batch.prompt_lists(), batch.response_lists(), adv.tolist()):
        ids = torch.tensor([prompt + response])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / T
        logp = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None]).squeeze(1)
        objective = objective + a * logp.mean() / n
    (-objective).backward()
    expected = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert set(expected) == set(captured["grads"])
    for name, grad in expected.items():
        torch.testing.assert_close(captured["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    "overrides",
    [
        ["--model.algorithm.ibpo.variant", "mask"],
        ["--model.algorithm.ibpo.variant", "ratio", "--model.algorithm.ibpo.lam", "0.5"],
        ["--model.algorithm.loss", "grpo", "--model.algorithm.agg_mode", "token-mean", "--model.algorithm.beta_kl",
         "0.01", "--model.algorithm.eps_low", "0.2", "--model.algorithm.eps_high", "0.28"],
        ["--model.algorithm.beta_kl", "0.05", "--model.algorithm.kl_estimator", "k2", "--model.algorithm.entropy_coef",
         "0.01"],
        ["--model.algorithm.overlong.mask_truncated", "true", "--model.algorithm.overlong.soft_buffer", "4"],
        ["--model.rollout.num_mini_batches", "2", "--model.rollout.old_logp", "trainer"],
        ["--model.rollout.old_logp", "rollout", "--model.algorithm.advantage_scale", "none"],
        ["--model.algorithm.loss", "grpo", "--model.algorithm.advantage_scale", "rloo"],
        ["--model.algorithm.loss", "grpo", "--model.algorithm.advantage_scale", "reinforce_plus_plus_baseline"],
        ["--model.algorithm.advantage_scale", "reinforce_plus_plus", "--model.algorithm.beta_kl", "0.01"],
        ["--model.algorithm.loss", "grpo", "--model.algorithm.eps_low", "0.2", "--model.algorithm.eps_high", "0.28",
         "--model.algorithm.advantage_scale", "reinforce_plus_plus", "--model.algorithm.beta_kl", "0.01",
         "--model.algorithm.gamma", "0.99"],
    ],
    ids=["ibpo-mask", "ibpo-ratio", "dapo-kl", "gspo-kl-entropy", "overlong", "two-mini-batches", "rollout-logp-drgrpo",
         "rloo", "reinforce-pp-baseline", "reinforce-pp-gspo-ibpo", "reinforce-pp-grpo"],
)
def test_variants_train(tmp_path, overrides):
    cli = fit(tmp_path, *overrides, steps=2)
    # trainer.max_steps counts optimizer steps: with two mini-batches that is one rollout batch
    assert cli.trainer.global_step == 2
    assert cli.model.rollout_step == (1 if "--model.rollout.num_mini_batches" in overrides else 2)
    logged = scalars(tmp_path)
    assert all(torch.isfinite(torch.tensor(logged["train/loss"])))
    assert all(h > 0 for h in logged["train/entropy"])  # logged whatever the loss
    if "--model.algorithm.overlong.soft_buffer" in overrides:  # the tiny model rarely stops: both act
        assert min(logged["train/overlong_penalty"]) < 0 and max(logged["train/masked_truncated"]) > 0
    if "--model.algorithm.beta_kl" in overrides:
        assert logged["train/kl"][0] == pytest.approx(0.0, abs=1e-6)  # the first step's policy is the reference
    if "reinforce_plus_plus" in overrides:  # the KL went into the reward (train/kl), not into the loss
        assert cli.model.ref_policy is not None and cli.model.updater.regularizer.beta_kl == 0
        assert logged["train/zero_adv_frac"] == [0.0, 0.0]  # no group baseline: every row trains


def test_validation_logs_avg_at_k_on_held_out_prompts(tmp_path):
    fit(tmp_path, "--data.val_size", "4", "--trainer.val_check_interval", "2", "--trainer.check_val_every_n_epoch",
        "null", "--trainer.num_sanity_val_steps", "0", "--model.val_samples", "2", steps=4)
    logged = scalars(tmp_path)
    assert len(logged["val/accuracy"]) == 2  # after steps 2 and 4
    assert all(0.0 <= a <= 1.0 for a in logged["val/accuracy"])
