"""scripts/compare.py end to end on the tiny model: runs, summary, table, plot, resume."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _command(out, *more: str) -> list[str]:
    return [sys.executable, os.path.join(ROOT, "scripts", "compare.py"), "--base", os.path.join(ROOT, "configs", "tiny.yaml"),
            "--seeds", "0", "--budget-flops", "3e8", "--val-size", "2", "--val-every", "2", "--small-group", "2",
            *more, "--out", str(out)]


FINAL_EVAL = ("--final-eval", "5", "--final-eval-k", "2", "--final-eval-backend", "hf")


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """One comparison of the default arms with ``--final-eval``, read by both tests below (a
    comparison is minutes of runs): its folder, its command, and its summaries and table as that
    first call left them (the first test adds arms to the folder afterwards)."""
    out = tmp_path_factory.mktemp("compare") / "cmp"
    cmd = _command(out, *FINAL_EVAL)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out, cmd, json.loads((out / "summary.json").read_text()), (out / "compare.md").read_text()


@pytest.mark.slow
def test_compare_runs_every_arm_to_the_same_budget_and_reports(compared):
    out, cmd, summaries, table = compared
    assert sorted(s["arm"] for s in summaries) == ["gspo_large_group", "ibpo_plain"]
    for s in summaries:
        assert s["flops"] >= 3e8  # stopped by the budget, not by max_steps
        flops = [v for _, v in s["series"]["compute/flops"]]
        assert len(flops) < 2 or flops[-2] < 3e8  # ... and at the first step that reached it
        assert s["baseline_val"] is not None and 0 <= s["baseline_val"] <= 1
        assert "train/reward" in s["series"] and "compute/flops" in s["series"]
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
    # runs keep no checkpoint unless asked to (the first call's were deleted after their final
    # evaluation); --keep-checkpoints keeps the last one, --final-eval or not
    plain_cmd = _command(out)  # (no --final-eval)
    unkept = subprocess.run([*plain_cmd, "--arms", "ibpo_ratio"], capture_output=True, text=True, cwd=ROOT)
    assert unkept.returncode == 0, unkept.stdout[-2000:] + unkept.stderr[-2000:]
    assert "[compare] ibpo_ratio seed 0 ..." in unkept.stdout
    assert not (out / "runs" / "ibpo_ratio_s0" / "checkpoints").exists()
    kept = subprocess.run([*plain_cmd, "--arms", "ibpo_mask", "--keep-checkpoints"], capture_output=True, text=True,
                          cwd=ROOT)
    assert kept.returncode == 0, kept.stdout[-2000:] + kept.stderr[-2000:]
    assert (out / "runs" / "ibpo_mask_s0" / "checkpoints" / "last.ckpt").is_file()
    # the calls that added an arm read the untrained model's score back instead of re-scoring it
    assert [p.name for p in (out / "runs" / "baseline_s0" / "lightning_logs").iterdir()] == ["version_0"]
    assert all(s["baseline_val"] == summaries[0]["baseline_val"] for s in json.loads((out / "summary.json").read_text()))


@pytest.mark.slow
def test_final_eval_scores_each_runs_last_checkpoint_on_the_held_out_stream(compared):
    out, _, summaries, table = compared
    untrained = json.loads((out / "runs" / "baseline_eval" / "n5_k2_hf.json").read_text())
    assert untrained["ckpt"] is None and untrained["decoding"]["max_new_tokens"] == 24  # tiny.yaml's rollout
    for s in summaries:
        result = json.loads((out / "runs" / f"{s['arm']}_s0" / "final_eval.json").read_text())
        assert result["ckpt"].endswith(os.path.join(f"{s['arm']}_s0", "checkpoints", "last.ckpt"))
        assert (result["n_problems"], result["k"], result["backend"], result["seed"]) == (5, 2, "hf", 0)
        assert s["final_eval"] == result["avg@k"] and len(s["final_eval_correct"]) == 5
        assert all(0 <= c <= 2 for c in s["final_eval_correct"])
        assert s["baseline_eval"] == untrained["avg@k"]
        assert not (out / "runs" / f"{s['arm']}_s0" / "checkpoints" / "last.ckpt").exists()  # deleted after
    assert "final-eval, end" in table
    assert "- final validation, ibpo_plain - gspo_large_group (5 problems x 2 samples, hf; paired by seed" in table
    assert "n = 1 seeds): " in table  # one seed: the difference, no interval
    assert "- final validation per seed, ibpo_plain (95% t over the 5 problems): seed 0 " in table


@pytest.mark.slow
def test_a_run_another_process_is_training_is_skipped_not_trained_twice(tmp_path):
    """Two comparisons sharing --out (one per core): the run one holds is left to it."""
    from filelock import FileLock

    out = tmp_path / "cmp"
    (out / "runs" / "ibpo_plain_s0").mkdir(parents=True)
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "compare.py"), "--base", os.path.join(ROOT, "configs", "tiny.yaml"),
           "--arms", "ibpo_plain", "--seeds", "0", "--budget-flops", "3e8", "--val-size", "2", "--small-group", "2",
           "--out", str(out)]
    with FileLock(str(out / "runs" / "ibpo_plain_s0" / ".claim")):  # "another process" training it
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[compare] ibpo_plain seed 0: another process is running it, skipped" in done.stdout
    assert "[compare] ibpo_plain seed 0 ..." not in done.stdout
    assert not (out / "runs" / "ibpo_plain_s0" / "config.yaml").exists()
    summary = out / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text()) == []
