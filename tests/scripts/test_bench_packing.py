"""scripts/bench_packing.py on the CPU, tiny shape, fp32: every arm runs on the same rows and
agrees with the padded forward to float rounding (a packed arm whose rows attended to each other
would not); an attention implementation that cannot run is reported, not fatal."""
import json


def test_every_arm_runs_and_agrees_with_the_padded_forward(load_script, tmp_path):
    bench = load_script("bench_packing")
    out = tmp_path / "packing.json"
    result = bench.main(["--device", "cpu", "--shape", "tiny", "--prompts", "2", "--group-size", "3",
                         "--prompt-tokens", "4", "12", "--response-tokens", "2", "20", "--warmup", "0",
                         "--repeats", "1", "--attn", "sdpa", "eager", "no-such-attention", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert list(result["arms"]) == ["per_row", "shared", "packed[sdpa]", "packed[eager]"]
    assert "packed[no-such-attention]" in result["errors"]
    assert result["rows"] == 6 and result["real_tokens"] < result["padded_tokens"]
    for name, arm in result["arms"].items():
        assert arm["max_abs_logp_diff"] < 1e-5, name
        assert len(arm["all_s"]) == 1 and arm["median_s"] > 0
