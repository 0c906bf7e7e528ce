"""scripts/variance_at_fixed_policy.py on the tiny model, where the answer is known: with one
problem repeated, the prompts' groups are i.i.d., so the gradient's variance falls as 1/rows."""
import json
import math
import os

import pytest
import torch

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")

# A reward with spread on a random model (the verifier would score everything 0: no gradient).
PARITY = """
import zlib

def parity(prompts, completions, **columns):
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]
"""


@pytest.fixture
def problems(shared_data):
    """GSM8K's training set (only its problem texts matter: the reward below ignores the golds)."""
    return str(shared_data("gsm8k_train.jsonl"))


@pytest.fixture
def parity_reward(tmp_path, monkeypatch):
    (tmp_path / "parity_reward.py").write_text(PARITY)
    monkeypatch.syspath_prepend(str(tmp_path))  # reward workers start with this process's sys.path
    return "model.reward=parity_reward:parity"


def _run(script, tmp_path, problems, reward, *extra):
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}.json"
    report = script.main(["--config", TINY, "--problems", problems, "--param_filter", r"layers\.0\.",
                          "--overrides", reward, "--out", str(out), *extra])
    assert json.loads(out.read_text())["results"].keys() == report["results"].keys()
    return report


@pytest.mark.slow
def test_variance_falls_as_one_over_rows_for_iid_groups(tmp_path, load_script, problems, parity_reward):
    script = load_script("variance_at_fixed_policy")
    few = _run(script, tmp_path, problems, parity_reward, "--repeat_one", "--num_prompts", "2", "--batches", "16",
               "--methods", "gspo")["results"]["gspo"]
    many = _run(script, tmp_path, problems, parity_reward, "--repeat_one", "--num_prompts", "8", "--batches", "16",
                "--methods", "gspo")["results"]["gspo"]
    assert (few["rows_per_batch"], many["rows_per_batch"]) == (16, 64)
    assert 2.0 < few["trace_cov"] / many["trace_cov"] < 8.0  # 4 expected
    assert 0.5 < few["trace_cov_x_rows"] / many["trace_cov_x_rows"] < 2.0  # equal at equal rows
    assert few["trace_cov_ci"][0] < few["trace_cov"] < few["trace_cov_ci"][1]
    assert many["flops_per_batch"] > 3 * few["flops_per_batch"]


@pytest.mark.slow
def test_ibpo_batches_carry_their_corrections(tmp_path, load_script, problems, parity_reward):
    script = load_script("variance_at_fixed_policy")
    report = _run(script, tmp_path, problems, parity_reward, "--num_prompts", "2", "--batches", "3",
                  "--methods", "gspo", "ibpo_plain")
    gspo, ibpo = report["results"]["gspo"], report["results"]["ibpo_plain"]
    assert ibpo["rows_per_batch"] > gspo["rows_per_batch"] == 16  # correction samples trained jointly
    assert ibpo["flops_per_batch"] > gspo["flops_per_batch"]  # their generation counts
    assert report["vs_baseline"]["gspo"]["trace_ratio"] == 1.0
    # intervals paired by prompt, scaled by each comparison's cost ratio (NaN: a leave-one-out of 3
    # batches x 2 prompts whose baseline trace is 0 has no ratio)
    q = report["vs_baseline"]["ibpo_plain"]
    lo, hi = q["trace_ratio_ci"]
    assert (0 <= lo <= hi) or (math.isnan(lo) and math.isnan(hi))
    rows = ibpo["rows_per_batch"] / gspo["rows_per_batch"]
    assert q["trace_ratio_equal_rows_ci"] == pytest.approx([lo * rows, hi * rows], nan_ok=True)
    assert ibpo["prompt_ids"] == gspo["prompt_ids"] == ["problems.jsonl:1", "problems.jsonl:2"]  # stable names
    assert torch.tensor(ibpo["prompt_cross_grams"]).shape == (2, 2, 3, 3)  # prompts x prompts x batches x batches
    # signal-to-noise: the baseline against itself differs by exactly 0 on every leave-one-out
    assert report["vs_baseline"]["gspo"]["snr_minus_baseline_ci"] == [0.0, 0.0]
    assert q["snr_minus_baseline"] == pytest.approx(ibpo["signal_to_noise"] - gspo["signal_to_noise"])
    # batch m of both sampled the same rollouts (what pairs the intervals by batch), new ones each batch
    assert ibpo["rollout_digests"] == gspo["rollout_digests"] and len(set(gspo["rollout_digests"])) == 3
    assert f"{q['trace_ratio']:.2f} [{lo:.2f}, {hi:.2f}]" in script.markdown(report["results"], report["vs_baseline"])
    # a saved run's table is rebuilt from its JSON alone, intervals included, and saved again with --out
    saved, again = tmp_path / "saved.json", tmp_path / "again.json"
    saved.write_text(json.dumps(report))
    table = script.main(["--report", str(saved), "--out", str(again)])["table"]
    assert table == script.markdown(report["results"], report["vs_baseline"])
    rewritten = json.loads(again.read_text())
    assert rewritten["results"]["ibpo_plain"]["prompt_cross_grams"] == ibpo["prompt_cross_grams"]  # measurements kept
    assert rewritten["results"]["ibpo_plain"]["trace_cov"] == pytest.approx(ibpo["trace_cov"])
    assert "jackknife" in rewritten["statistics"]
    with pytest.raises(SystemExit):
        script.main(["--problems", problems])  # neither a config nor --report
    # a file from before the cross-prompt Gram matrices says so instead of failing on a key
    for r in report["results"].values():
        r["prompt_grams"] = r.pop("prompt_cross_grams")
    saved.write_text(json.dumps(report))
    with pytest.raises(SystemExit, match="older version of this script"):
        script.main(["--report", str(saved)])
