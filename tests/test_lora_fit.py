"""LoRA in a real fit (issue 20, item 1): only the adapters change, the checkpoint holds only them,
a resumed run continues exactly, and the KL reference is the base without a copy of the model."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from ibpo_lit.__main__ import main
from ibpo_lit.models.loading import build_builtin_model

pytestmark = pytest.mark.xdist_group("tiny_vllm")  # the session's engine (tests/conftest.py)

TINY = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.yaml")
PARITY = """
import zlib

def parity(prompts, completions, **columns):
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]
"""


@pytest.fixture
def parity_reward(tmp_path, monkeypatch):
    """A reward with spread on a random model (math-verify would give every rollout 0: no gradient)."""
    folder = tmp_path / "reward"
    folder.mkdir()
    (folder / "parity_reward.py").write_text(PARITY)
    monkeypatch.syspath_prepend(str(folder))
    return ["--model.reward", "parity_reward:parity"]


def _fit(root, steps, *extra, ckpt=None):
    sys.argv = sys.argv[:1]
    args = ["fit", "--config", TINY, "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root),
            "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
            "--model.lora.r", "4", "--model.lora.alpha", "8", *extra]
    if ckpt is not None:
        args += ["--ckpt_path", str(ckpt)]
    return main(args)


def _adapters(policy):
    return {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_only_the_adapters_train_and_the_checkpoint_holds_only_them(tmp_path, parity_reward):
    cli = _fit(tmp_path, 2, *parity_reward)
    policy = cli.model.policy
    base = build_builtin_model("tiny-llama", "float32", cli.model.rollout_cfg.seed).state_dict()
    for name, tensor in policy.get_base_model().state_dict().items():
        if ".lora_" not in name:
            assert torch.equal(tensor, base[name.replace(".base_layer.", ".")]), name  # frozen
    adapters = _adapters(policy)
    assert adapters and all(".lora_" in n for n in adapters)
    assert any(n.endswith("lora_B.default.weight") and t.abs().sum() > 0 for n, t in adapters.items())  # trained
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    policy_keys = {k for k in ckpt["state_dict"] if k.startswith("policy.")}
    assert policy_keys == {f"policy.{n}" for n in adapters}


@pytest.mark.slow
def test_a_resumed_lora_run_continues_exactly(tmp_path, parity_reward):
    same_schedule = [*parity_reward, "--model.optim.total_steps", "4"]  # stopping at 2 must not shorten it
    straight = _adapters(_fit(tmp_path / "straight", 4, *same_schedule).model.policy)
    _fit(tmp_path / "split", 2, *same_schedule)
    resumed = _adapters(_fit(tmp_path / "split", 4, *same_schedule,
                             ckpt=tmp_path / "split" / "checkpoints" / "last.ckpt").model.policy)
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name


@pytest.mark.slow
def test_kl_reference_is_the_base_without_a_copy(tmp_path, parity_reward):
    cli = _fit(tmp_path, 2, *parity_reward, "--model.algorithm.beta_kl", "0.1")
    assert cli.model.ref_policy is None
    metrics = cli.trainer.logged_metrics
    assert torch.isfinite(metrics["train/kl"]) and float(metrics["train/kl"]) >= 0


def test_lora_under_fsdp2_is_refused_before_loading(tmp_path):
    from ibpo_lit.config_checks import lora_fits
    from ibpo_lit.models.lora import LoRAConfig
    from ibpo_lit.scale.strategy import FSDP2Strategy

    assert "not supported" in lora_fits(LoRAConfig(), FSDP2Strategy())
    assert lora_fits(None, FSDP2Strategy()) is None


@pytest.mark.slow
def test_the_vllm_engine_samples_from_the_merged_adapters(tmp_path, parity_reward, tiny_vllm):
    # (tiny_vllm only to skip without vLLM: the fit runs in its own process.) After each step the
    # sync sends base + adapters merged; the engine's log-probs of its own samples must then be the
    # trainer's (an engine left with the base weights would be off once the adapters moved).
    import subprocess

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = os.path.join(os.path.dirname(__file__), "..")
    cmd = [sys.executable, "-m", "ibpo_lit", "fit", "--config", os.path.join(root, "configs", "tiny_vllm.yaml"),
           "--trainer.default_root_dir", str(tmp_path), "--trainer.max_steps", "3", "--model.lora.r", "4",
           "--model.lora.alpha", "64", "--model.optim.lr", "0.01", *parity_reward]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.abspath(root), str(tmp_path / "reward")])}
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    values: dict[str, list[float]] = {}
    for f in sorted((tmp_path / "lightning_logs").rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f))
        acc.Reload()
        for tag in ("rollout/logprob_mismatch", "rollout/probe_mismatch", "train/grad_norm"):
            if tag in acc.Tags()["scalars"]:
                values.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    assert max(values["train/grad_norm"]) > 0  # the adapters did move
    assert len(values["rollout/logprob_mismatch"]) == 3 and max(values["rollout/logprob_mismatch"]) < 1e-3
    assert max(values["rollout/probe_mismatch"]) < 0.01
