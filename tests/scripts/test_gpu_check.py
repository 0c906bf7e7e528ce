"""scripts/gpu_check.py runs its whole measurement on the CPU with tiny shapes (the GPU machine
runs the same code with Qwen3 shapes): the step is the real FSDP2 + bf16 training step."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_measures_a_cpu_step(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--shapes", "tiny", "--steps", "2",
                           "--max-new-tokens", "16", "--peak-tflops", "0.2", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = json.loads(out.read_text())
    assert result["shape"] == "tiny" and result["steps_timed"] == 2
    assert result["step_s"] > 0 and result["update_s"] > 0 and result["trained_tokens_per_step"] > 0
    assert 0 < result["mfu_update"] < 1
    assert set(result["plan_peak_gib"]) == {"rollout", "corrections", "update"}  # the HF engine: no weight sync
    assert "tiny:" in done.stdout and "(plan: " in done.stdout


def test_gpu_check_refuses_a_machine_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--shapes", "tiny"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stderr
