"""Two processes on the CPU (DDP, gloo): only trainer.* changes in the config. The ranks train
on different prompts, stay identical replicas, and finish."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


@pytest.mark.slow
def test_two_process_ddp_run(tmp_path):
    callback = '{"class_path": "multiprocess_probe.RankRecorder", "init_args": {"out_dir": "%s"}}' % tmp_path
    cmd = [sys.executable, "-m", "ibpo_lit", "fit", "--config", os.path.join(ROOT, "configs", "tiny.yaml"),
           "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.max_steps", "3",
           "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
           "--trainer.callbacks+", callback]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world_size"] == 2 and r["steps"] == 3 for r in ranks)
    assert ranks[0]["weights"] == ranks[1]["weights"]  # DDP kept the replicas equal
    seen = [{uid for batch in r["uids"] for uid in batch} for r in ranks]
    assert len(seen[0]) == len(seen[1]) == 3 * 2  # 3 steps x prompts_per_step 2, no repeats
    assert not seen[0] & seen[1]  # each rank its own prompts
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
