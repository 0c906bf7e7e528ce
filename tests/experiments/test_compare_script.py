"""scripts/compare.py end to end on the tiny model: runs, summary, table, plot, resume."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.slow
def test_compare_runs_every_arm_to_the_same_budget_and_reports(tmp_path):
    out = tmp_path / "cmp"
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "compare.py"), "--base", os.path.join(ROOT, "configs", "tiny.yaml"),
           "--seeds", "0", "--budget-flops", "3e8", "--val-size", "2", "--val-every", "2", "--small-group", "2",
           "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summaries = json.loads((out / "summary.json").read_text())
    assert sorted(s["arm"] for s in summaries) == ["gspo_large_group", "ibpo_plain"]
    for s in summaries:
        assert s["flops"] >= 3e8  # stopped by the budget, not by max_steps
        flops = [v for _, v in s["series"]["compute/flops"]]
        assert len(flops) < 2 or flops[-2] < 3e8  # ... and at the first step that reached it
        assert s["baseline_val"] is not None and 0 <= s["baseline_val"] <= 1
        assert "train/reward" in s["series"] and "compute/flops" in s["series"]
    table = (out / "compare.md").read_text()
    assert "| gspo_large_group | 1 |" in table and "| ibpo_plain | 1 |" in table
    assert (out / "compare.png").stat().st_size > 10_000
    # a second call finds every run done: nothing reruns, the report is rebuilt
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 0 and "[compare] ibpo_plain seed 0 ..." not in again.stdout
    assert json.loads((out / "summary.json").read_text()) == summaries
    # lambda_0.6 is ibpo_plain on this base: its result is that run's, nothing is trained
    twin = subprocess.run([*cmd, "--arms", "ibpo_plain", "lambda_0.6"], capture_output=True, text=True, cwd=ROOT)
    assert twin.returncode == 0, twin.stdout[-2000:] + twin.stderr[-2000:]
    assert "same config as ibpo_plain" in twin.stdout and "[compare] lambda_0.6 seed 0 ..." not in twin.stdout
    assert not (out / "runs" / "lambda_0.6_s0").exists()
    (plain,) = [s for s in summaries if s["arm"] == "ibpo_plain"]
    (lam,) = [s for s in json.loads((out / "summary.json").read_text()) if s["arm"] == "lambda_0.6"]
    assert lam == dict(plain, arm="lambda_0.6", same_run_as="ibpo_plain")
    # the call that added an arm read the untrained model's score back instead of re-scoring it
    assert [p.name for p in (out / "runs" / "baseline_s0" / "lightning_logs").iterdir()] == ["version_0"]
    assert all(s["baseline_val"] == summaries[0]["baseline_val"] for s in json.loads((out / "summary.json").read_text()))
