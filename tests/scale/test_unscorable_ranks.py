"""A reward that scores nothing, on two processes (issue 30, item 6): the stop counts the rows of
every process, so a process whose rows are all unscorable while the other's are fine does not
stop the run, and when every row of every process is unscorable for
``model.max_unscorable_steps`` steps both processes stop together, each with the one-line
error, none left waiting in a collective (a hang would fail the test at its timeout).

``misbehaving_rewards:fails_on_rank_zero_then_everywhere`` raises on rank 0 at every call and on
rank 1 from its second call on (one reward worker, one call per step: no corrections, no
validation). With ``max_unscorable_steps: 2``: step 1 has rank 1's scorable rows (no count),
steps 2 and 3 have none anywhere, so the run stops at step 3. A count of each process's own
rows would stop rank 0 alone at step 2 and leave rank 1 waiting.
"""
import os
import re
import signal
import subprocess

import pytest
import torch

from fit_runs import REPO, fit_command, fit_env

TIMEOUT_S = 240


@pytest.mark.slow
def test_a_stop_counts_every_process_and_ends_them_together(tmp_path):
    env = fit_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "rewards"), env["PYTHONPATH"]])
    command = fit_command(
        "tiny.yaml", tmp_path,
        "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.max_steps", "6",
        "--trainer.logger", "false", "--trainer.limit_val_batches", "0", "--trainer.callbacks", "[]",
        "--model.algorithm.ibpo.variant", "none",
        "--model.reward", "misbehaving_rewards:fails_on_rank_zero_then_everywhere",
        "--model.max_unscorable_steps", "2",
    )
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the run did not end within {TIMEOUT_S} s (a rank left waiting?):\n{err[-3000:]}")
    assert proc.returncode == 2, err[-3000:]
    # both processes print the same line (their writes may interleave on the shared stderr)
    stops = re.findall(re.escape(
        "ibpo-lit: error: reward 'misbehaving_rewards:fails_on_rank_zero_then_everywhere' could not score any "
        "response for 2 steps in a row (last error: RuntimeError: judge offline in "
        "fails_on_rank_zero_then_everywhere at misbehaving_rewards.py:") + r"\d+" + re.escape(
        "); fix the reward or raise model.max_unscorable_steps"), err)
    assert len(stops) == 2, err[-3000:]
    assert "Traceback" not in err
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["ibpo_lit"]
    # steps 1 and 2 finished (rank 1's scorable rows kept step 1 out of the count), step 3 stopped
    assert saved["rollout_step"] == 2 and saved["unscorable_streak"] == {"run": 1}
