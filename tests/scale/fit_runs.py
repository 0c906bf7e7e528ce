"""Running ``python -m ibpo_lit fit`` as users do, on 1 or 2 CPU processes, for the scale tests (imported by them).

Two processes are started by Lightning's own launcher (``trainer.devices: 2``), as in the
README; the runs use one intra-op thread each (two processes on two cores; also what makes two
runs of the same command reproducible, see tests/test_resume.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TIMEOUT_S = 420  # a hang (mismatched collectives) fails the test instead of stalling CI
# Set by a launcher or by Lightning in *this* process (its `_init_dist_connection` writes
# MASTER_ADDR/MASTER_PORT into os.environ): a child that inherits them rendezvouses on the
# parent's port, which the parent's store may still hold (EADDRINUSE on the H200, 2026-11-27,
# when scripts/gpu_check.py ran `pytest -m gpu` after its own fits). Each child picks its own.
LAUNCHER_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID")


def two_process_results(script: Path, out_dir: Path) -> list[dict]:
    """Run ``script OUT_DIR`` on 2 processes (torchrun, gloo) and read each rank's
    ``OUT_DIR/rank<r>.json``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script), str(out_dir)]
    done = subprocess.run(cmd, cwd=REPO, env=fit_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]


def fit_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # faulthandler: a worker that dies of a signal prints its Python stack (or "no Python frame")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    return env


def callbacks(*specs: dict) -> str:
    """``--trainer.callbacks`` value replacing the config's list."""
    return json.dumps(list(specs))


def recorder(out_dir: Path) -> dict:
    return {"class_path": "multiprocess_probe.RankRecorder", "init_args": {"out_dir": str(out_dir)}}


def scripted(mode: str = "hash") -> dict:
    return {"class_path": "multiprocess_probe.ScriptedRewards", "init_args": {"mode": mode}}


CORRECTIONS = {"class_path": "callbacks.CorrectionRollouts"}
SHARED_FITS = "scale_fits"  # the xdist group of the files reading conftest.shared_fit's runs (tests/conftest.py)


def fit_command(config: str, root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ibpo_lit", "fit", "--config", str(REPO / "configs" / config),
            "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false", *extra]


def run_fit(config: str, root: Path, *extra: str) -> subprocess.CompletedProcess:
    """Run to completion (the process group is killed past ``TIMEOUT_S``); asserts success."""
    root.mkdir(parents=True, exist_ok=True)
    proc = start_fit(config, root, *extra)
    try:
        proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the run did not finish within {TIMEOUT_S} s (a hang?):\n{_tail(root)}")
    assert proc.returncode == 0, _tail(root)
    return proc


def start_fit(config: str, root: Path, *extra: str) -> subprocess.Popen:
    """Start a run in its own process group (so a test can SIGKILL every rank at once)."""
    root.mkdir(parents=True, exist_ok=True)
    log = open(root / "fit.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(fit_command(config, root, *extra), cwd=root, env=fit_env(), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _tail(root: Path) -> str:
    log = root / "fit.log"
    return log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"


def read_ranks(out_dir: Path, world: int) -> list[dict]:
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def scalars(root: Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` over every TensorBoard version under ``root``."""
    import glob

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for version in sorted(glob.glob(str(root / "lightning_logs" / "version_*")), key=lambda p: int(p.rsplit("_", 1)[1])):
        acc = EventAccumulator(version, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for e in acc.Scalars(tag):
                out.setdefault(tag, {})[e.step] = e.value
    return out
