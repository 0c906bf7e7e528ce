"""Checks that need a CUDA device (skipped on the CPU): FSDP2 with bf16 mixed precision on one
GPU, the chunked log-prob head on the GPU, and scripts/gpu_check.py itself; and the first one's
script run on the CPU, so a mistake of the script's own never waits for a GPU lease."""
import json
import subprocess
import sys

import pytest
import torch
from fit_runs import REPO, fit_env

gpu = pytest.mark.gpu  # each test that needs a CUDA device; the CPU twin below runs everywhere


FSDP2_BF16_MIXED = r"""
import json, sys, torch, lightning as L
from ibpo_lit.module import IBPOModule
from ibpo_lit.config import AlgorithmConfig, IBPOConfig
from ibpo_lit.data.datamodule import PromptDataModule
from ibpo_lit.scale import FSDP2Strategy
class Probe(L.Callback):
    def on_train_batch_end(self, trainer, m, *a):
        p = next(m.policy.parameters())
        self.out = {"param": str(p.dtype), "grad_norm": float(trainer.callback_metrics["train/grad_norm"]),
                    "compute": str(m.policy.lm_head.weight.dtype)}
probe = Probe()
t = L.Trainer(accelerator=sys.argv[2], devices=1, strategy=FSDP2Strategy(), precision="bf16-mixed",
              max_steps=int(sys.argv[3]), logger=False, enable_checkpointing=False, enable_progress_bar=False,
              callbacks=[probe])
t.fit(IBPOModule(model="tiny-qwen3", algorithm=AlgorithmConfig(ibpo=IBPOConfig(variant="none"))),
      PromptDataModule(tokenizer="tiny-qwen3"))
json.dump(probe.out, open(sys.argv[1], "w"))
"""


def fsdp2_bf16_mixed_step(tmp_path, accelerator: str, steps: int) -> dict:
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-c", FSDP2_BF16_MIXED, str(out), accelerator, str(steps)], cwd=REPO,
                          env=fit_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@gpu
def test_fsdp2_bf16_mixed_keeps_fp32_master_weights_and_gradients(tmp_path):
    """One GPU, FSDP2Strategy, precision bf16-mixed: the trained model's parameters and
    gradients stay fp32 (FSDP2 casts the gathered copies), the step is finite."""
    result = fsdp2_bf16_mixed_step(tmp_path, "gpu", steps=2)
    assert result["param"] == "torch.float32"
    assert result["grad_norm"] == result["grad_norm"]  # finite


def test_the_gpu_tests_fit_script_runs_on_the_cpu(tmp_path, monkeypatch):
    """The same script, one step on the CPU: the GPU test failed on its first lease for a
    reason of its own (a string where the code takes an ``IBPOConfig``), which a CPU run of the
    same code shows without a GPU. And on its second (H200, 2026-11-27) for another: it ran in
    scripts/gpu_check.py's process after that process's own fits, whose Lightning had written
    MASTER_PORT into os.environ while its store still held the port; the child inherited it and
    failed with EADDRINUSE. Here this process holds a store on the port its environment names,
    as gpu_check's did: the child must rendezvous on a port of its own (``fit_env``)."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # holds its port
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    result = fsdp2_bf16_mixed_step(tmp_path, "cpu", steps=1)
    assert result["param"] == "torch.float32"


@gpu
def test_chunked_head_on_the_gpu_matches_full_logits():
    from ibpo_lit.models import build_tiny_model
    from ibpo_lit.rollout import HFRolloutEngine, SamplingConfig
    from ibpo_lit.training.logprobs import response_logprobs

    model = build_tiny_model(seed=0).cuda()
    batch = HFRolloutEngine(model, [2], 2, SamplingConfig(max_new_tokens=24)).generate([[5, 6, 7], [8, 9]], n=4,
                                                                                    seeds=range(8))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        full = response_logprobs(model, batch, 1.0)
        chunked = response_logprobs(model, batch, 1.0, single_pass=True, chunk_tokens=16)
    mask = batch.response_mask
    assert (full - chunked)[mask].abs().max() < 0.05  # bf16 compute, two code paths


@gpu
def test_gpu_check_runs_on_the_gpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--shapes", "tiny", "--row-tokens", "64",
                           "--prompt-tokens", "16", "--predict", "--stages", "1", "--out", str(out)],
                          cwd=REPO, env=fit_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (case,) = [c for c in json.loads(out.read_text())["cases"] if c["status"] == "ran"]
    assert case["measured"]["peak_allocated_gib"] > 0 and case["measured"]["seconds_per_step"] > 0
