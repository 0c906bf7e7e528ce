"""summary.json merged under a lock: two writers keep each other's runs."""
import json
import multiprocessing as mp

from ibpo_lit.experiments.summary_store import load_summaries, record_summary


def _write_arm(path: str, arm: str, n: int) -> None:
    for seed in range(n):
        record_summary(path, {"arm": arm, "seed": seed, "final_val": seed / 10})


def test_two_processes_writing_one_file_keep_every_run(tmp_path):
    path = str(tmp_path / "summary.json")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_arm, args=(path, arm, 25)) for arm in ("lambda_0.2", "alpha_0.5")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = {(s["arm"], s["seed"]) for s in json.loads(open(path).read())}
    assert got == {(arm, seed) for arm in ("lambda_0.2", "alpha_0.5") for seed in range(25)}


def test_a_stale_writer_does_not_drop_runs_and_a_rerun_replaces_in_place(tmp_path):
    path = str(tmp_path / "summary.json")
    record_summary(path, {"arm": "k1", "seed": 0, "final_val": 0.1})
    record_summary(path, {"arm": "k1", "seed": 1, "final_val": 0.2})
    record_summary(path, {"arm": "shaping_only", "seed": 0, "final_val": 0.3})
    merged = record_summary(path, {"arm": "k1", "seed": 0, "final_val": 0.5})
    assert [(s["arm"], s["seed"], s["final_val"]) for s in merged] == [
        ("k1", 0, 0.5), ("k1", 1, 0.2), ("shaping_only", 0, 0.3)]
    assert load_summaries(path) == merged
    assert load_summaries(str(tmp_path / "missing.json")) == []
    assert not list(tmp_path.glob("*.tmp*"))
