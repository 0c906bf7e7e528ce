"""scripts/bench_sandbox.py: both arms run the same canonical solutions; every one passes."""
import json


def test_bench_sandbox_times_both_arms_on_canonical_solutions(tmp_path, load_script, shared_data):
    lines = shared_data("mbpp_full.jsonl").read_text().splitlines()
    (tmp_path / "mbpp_full.jsonl").write_text("\n".join(lines[366:367] + lines[:2]) + "\n")  # 367 builds Nodes
    out = tmp_path / "sandbox.json"
    report = load_script("bench_sandbox").main(["--data", str(tmp_path), "--out", str(out)])
    assert json.loads(out.read_text()) == report
    for arm in ("baseline", "sandboxed"):
        assert report[arm]["programs"] == 3 and report[arm]["statuses"] == {"pass": 3, "unscorable": 0}
        assert report[arm]["not_passing"] == {} and report[arm]["mean_s_per_program"] > 0
    assert report["cost_ratio"] > 0
