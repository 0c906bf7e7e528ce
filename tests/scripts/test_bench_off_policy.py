"""scripts/bench_off_policy.py without its runs (they need the vLLM server and SmolLM2, tens of
minutes: docs/benchmarks.md): the per-step rows read from what its callback writes (each arm's
generation: its own step's synchronously, the next step's in the thread off-policy), the
medians and the summary's table, on hand-made records."""
import json


def _record(step, wall, metrics, sync_s=1.5):
    return {"step": step, "start": 100.0 * step, "end": 100.0 * step + wall, "wall_s": wall, "sync_s": sync_s,
            "metrics": metrics}


def test_rows_and_summary_from_the_callbacks_records(load_script, tmp_path):
    bench = load_script("bench_off_policy")
    sync = tmp_path / "sync.jsonl"
    sync.write_text("".join(json.dumps(_record(i, w, {
        "timing/generate_s": g, "timing/correct_s": 2.0, "timing/update_s": 5.0, "timing/step_s": w - 1.0,
        "train/reward": r, "train/response_len": 40.0})) + "\n" for i, (w, g, r) in enumerate(
        [(20.0, 10.0, 0.25), (16.0, 8.0, 0.5), (18.0, 9.0, 0.75)])))
    off = tmp_path / "off.jsonl"
    off.write_text("".join(json.dumps(_record(i, w, {
        "timing/ahead_generate_s": 7.0, "timing/generate_s": 99.0, "timing/update_s": 6.0, "timing/step_s": w,
        "timing/ahead_wait_s": 0.5, "time/overlap_s": 4.0, "time/ahead_start": 0.1, "rollout/staleness": float(i > 0),
        "train/reward": 0.5, "train/response_len": 30.0})) + "\n" for i, w in enumerate([30.0, 12.0, 14.0])))

    rows = bench._step_rows(sync)
    assert [r["generate_s"] for r in rows] == [10.0, 8.0, 9.0]  # this step's own generation
    assert rows[0]["outside_step_s"] == 1.0 and rows[0]["sync_s"] == 1.5
    off_rows = bench._step_rows(off)
    assert [r["generate_s"] for r in off_rows] == [7.0] * 3  # the thread's, not a key it does not log
    assert off_rows[1]["staleness"] == 1.0 and off_rows[0]["time/ahead_start"] == 0.1

    a, b = bench._summary_of(rows), bench._summary_of(off_rows)
    assert a["median"]["wall_s"] == 18.0 and a["median_after_first"]["wall_s"] == 17.0
    assert b["median"]["wall_s"] == 14.0 and b["median_after_first"]["wall_s"] == 13.0
    assert a["total_wall_s"] == 54.0 and a["reward"] == [0.25, 0.5, 0.75]
    summary = {"steps": 3, "date": "d", "commit": "c", "device": {"cpu": "cpu", "cores": 2}, "load_before": [1],
               "load_after": [2], "seed": 0, "arms": {"sync": a, "off_policy": b},
               "ratio_median": 18.0 / 14.0, "ratio_median_after_first": 17.0 / 13.0}
    table = bench._markdown(summary)
    assert "| sync | 3 | 18.0 | 17.0 | 9.0 | 5.0 | - | - | 54.0 |" in table
    assert "| off_policy | 3 | 14.0 | 13.0 | 7.0 | 6.0 | 0.5 | 4.0 | 56.0 |" in table
    assert "1.286 (steps after the first: 1.308)" in table
    assert "| 2 | 0.750 | 0.500 | 40.0 | 30.0 |" in table
    assert "OpenMP" not in table  # a run that kept no OpenMP settings (before --omp-wait-policy) says none

    summary["openmp"] = bench.openmp_settings({"OMP_WAIT_POLICY": "PASSIVE", "PATH": "/bin"})
    assert summary["openmp"] == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": None, "VLLM_CPU_OMP_THREADS_BIND": None}
    assert "one server. OpenMP: OMP_WAIT_POLICY=PASSIVE." in bench._markdown(summary)


def test_replot_redraws_the_table_and_the_curves_from_a_run_on_file(load_script, tmp_path):
    """--replot runs nothing: summary.md and curves.png come from summary.json, and a summary written
    before it kept each step's wall time takes them from the arm's steps.jsonl."""
    bench = load_script("bench_off_policy")
    arms = {}
    for arm, walls in (("sync", [20.0, 16.0]), ("off_policy", [30.0, 12.0])):
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "steps.jsonl").write_text("".join(json.dumps({"step": i, "wall_s": w}) + "\n"
                                                            for i, w in enumerate(walls)))
        arms[arm] = {"steps": 2, "median": dict.fromkeys(("wall_s", "generate_s", "update_s", "ahead_wait_s",
                                                           "time/overlap_s"), 1.0),
                     "median_after_first": {"wall_s": 1.0}, "total_wall_s": sum(walls),
                     "reward": [0.25, None], "response_len": [40.0, 30.0]}
    summary = {"steps": 2, "date": "d", "commit": "c", "device": {"cpu": "cpu", "cores": 2}, "load_before": [1],
               "load_after": [2], "seed": 0, "arms": arms, "ratio_median": 1.0, "ratio_median_after_first": 1.0}
    (tmp_path / "summary.json").write_text(json.dumps(summary))

    bench.main(["--replot", str(tmp_path)])
    assert "| 1 | - | - | 30.0 | 30.0 |" in (tmp_path / "summary.md").read_text()  # a step with no reward: "-"
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "sync" / "fit.log").exists()  # nothing ran
