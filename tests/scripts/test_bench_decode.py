"""scripts/bench_decode.py on the CPU with the tiny shape (fp32; the GPU machine runs the same code
on Qwen3-0.6B in bf16): every arm generates batch x max_new_tokens tokens in every call (counted
from what it returned), the HF engine's per-row seeds give the same tokens call after call in both
its decodes (the static one eager here, the engine's CPU default), the
compiled arm really compiles (once, in its warm-up) and its ratio to the HF engine is recorded, an
arm that fails is recorded while the next runs, and a spent budget cuts the timed calls and skips
the next arm. The compiled arm is in one test of its own: inductor takes tens of seconds here."""
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BATCH, NEW = 3, 5
TINY = ["--device", "cpu", "--shape", "tiny", "--batch", str(BATCH), "--prompt-tokens", "6",
        "--max-new-tokens", str(NEW), "--repeats", "2"]


@pytest.fixture
def bench(load_script, monkeypatch):
    """The script as a module, its budget counted from now (``IBPO_T0``, not the pytest process's
    start); afterwards the environment and any default process group it made are undone (stage 0 imports
    Lightning, as bench_update's fixture explains), and dynamo's compiled graphs dropped."""
    import os

    import torch.distributed as dist

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    saved = dict(os.environ)
    before = dist.is_available() and dist.is_initialized()  # a session vLLM engine's group: not ours to end
    os.environ["IBPO_T0"] = str(time.time())
    yield load_script("bench_decode")
    if not before and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    if "torch._dynamo" in sys.modules:  # the compiled arm's graphs stay out of later tests
        sys.modules["torch._dynamo"].reset()
    os.environ.clear()
    os.environ.update(saved)


def check_full(case: dict) -> None:
    calls = case["warmup"] + len(case["seconds"])
    assert case["tokens_per_call"] == [BATCH * NEW] * calls and case["all_calls_full"]
    assert case["tokens_per_s"] == pytest.approx(BATCH * NEW / case["median_s"])


def test_eager_arms_do_the_same_work_and_a_failing_arm_is_recorded(bench, tmp_path, monkeypatch):
    def broken(model, prompts, args):
        raise RuntimeError("out of memory (on purpose)")

    monkeypatch.setitem(bench.ARMS, "broken", broken)
    data = bench.main([*TINY, "--arms", "hf_engine", "hf_engine_static", "broken", "transformers_dynamic",
                       "--out-dir", str(tmp_path)])
    assert data["complete"] and data["skipped"] == []
    assert [c["name"] for c in data["cases"]] == ["hf_engine", "hf_engine_static", "broken", "transformers_dynamic"]
    assert data["failed"] == [{"name": "broken", "reason": "RuntimeError: out of memory (on purpose)"}]
    cases = {c["name"]: c for c in data["cases"]}
    engine, static, dynamic = cases["hf_engine"], cases["hf_engine_static"], cases["transformers_dynamic"]
    for case in (engine, static, dynamic):
        check_full(case)
        assert case["compile_warmup"]["graphs"] == case["compile_timed"]["graphs"] == 0  # eager
    for case in (engine, static):
        assert len(set(case["token_crcs"])) == 1  # per-row seeds: the same tokens every call
        assert case["per_row_seeds"] and case["log_probs"]
    assert static["decode"] == "static" and engine["decode"] == "dynamic"
    assert not static["compiled_step"]  # the engine's default on the CPU: an eager step
    assert static["token_crcs"][0] != engine["token_crcs"][0]  # the other uniform source: other samples
    assert not dynamic["per_row_seeds"]
    assert engine["speed_vs_hf_engine"] == 1.0 and static["speed_vs_hf_engine"] > 0 and dynamic["speed_vs_hf_engine"] > 0
    assert "hf_engine_over_static_compiled" not in data and "hf_engine_static_over_static_compiled" not in data
    assert data["work"]["expected_tokens_per_call"] == BATCH * NEW and data["device"] == "cpu"
    assert data["git_commit"] and data["date"]
    assert len(list(tmp_path.glob("cpu_*.json"))) == 1


# transformers' compiled static-cache decode on this CPU (inductor's C++ kernels, fp32) now and
# then samples from NaN probabilities in one process of many: 1 failing run of 25 under pytest with
# a warm inductor cache, 1 of 8 with a fresh one, once in the CI check of def721b; 0 in 300 calls
# within one process and 0 in ~35 processes run outside pytest. It is that library's CPU path, not
# the bench's code (the arm's failure is recorded as such, as the first test checks), and the
# bench's subject is the GPU. So one rerun on exactly that failure, and only that one.
NAN_SAMPLING = "probability tensor contains either `inf`, `nan` or element < 0"


def test_the_static_compiled_arm_compiles_once_and_is_compared_with_the_engine(bench, tmp_path):
    argv = [*TINY, "--arms", "hf_engine", "hf_engine_static", "transformers_static_compiled"]
    data = bench.main([*argv, "--out-dir", str(tmp_path / "first")])
    if [f["reason"] for f in data["failed"]] == [f"RuntimeError: {NAN_SAMPLING}"]:
        import torch._dynamo

        torch._dynamo.reset()  # else the rerun reuses the first run's graph and its warm-up compiles none
        data = bench.main([*argv, "--out-dir", str(tmp_path / "rerun")])
    assert data["failed"] == [] and data["skipped"] == []
    compiled = next(c for c in data["cases"] if c["name"] == "transformers_static_compiled")
    check_full(compiled)
    assert compiled["compiled_call"] and compiled["compile_config"]["compile_all_devices"]  # generate compiled
    assert compiled["compile_warmup"]["graphs"] >= 1 and compiled["compile_timed"]["graphs"] == 0
    assert data["hf_engine_over_static_compiled"] == pytest.approx(1 / compiled["speed_vs_hf_engine"])
    static = next(c for c in data["cases"] if c["name"] == "hf_engine_static")
    assert not static["compiled_call"]  # transformers' compiled forward is not this arm's
    assert data["hf_engine_static_over_static_compiled"] == pytest.approx(
        static["speed_vs_hf_engine"] / compiled["speed_vs_hf_engine"])


def test_a_spent_budget_cuts_the_timed_calls_and_skips_the_next_arm(bench, tmp_path):
    data = bench.main([*TINY, "--arms", "hf_engine", "transformers_dynamic", "--budget-s", "0.001",
                       "--out-dir", str(tmp_path)])
    engine, dynamic = data["cases"]
    assert engine["status"] == "ran" and len(engine["seconds"]) == 1 and engine["repeats_cut"].startswith("1 of 2")
    check_full(engine)
    assert dynamic["status"] == "skipped" and "left" in dynamic["reason"]


def test_the_floors_run_every_weight_matrix_once_a_step_and_only_when_asked(bench, tmp_path, monkeypatch):
    """The floor arms stand for batch x steps token slots, touch each of the model's weight
    matrices (7 a layer and the head: 2 layers in the tiny shape) once a step, and are left out of
    the default arms (they are bounds, not decodes)."""
    import torch
    import torch.nn.functional as F

    assert not any(name.startswith("floor_") for name in bench.DEFAULT_ARMS)
    assert bench.parse_args(TINY).arms == bench.DEFAULT_ARMS
    shapes = []
    real_linear = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, *a: shapes.append((tuple(x.shape), tuple(w.shape))) or real_linear(x, w, *a))
    data = bench.main([*TINY, "--arms", "hf_engine", "floor_weight_matmuls", "floor_weight_reads",
                       "--warmup", "0", "--out-dir", str(tmp_path)])
    assert data["failed"] == [] and data["skipped"] == []
    cases = {c["name"]: c for c in data["cases"]}
    matmuls, reads = cases["floor_weight_matmuls"], cases["floor_weight_reads"]
    for case in (matmuls, reads):
        check_full(case)
        assert case["weight_matrices"] == 7 * 2 + 1
        assert case["s_per_step"] == pytest.approx(case["median_s"] / NEW)
        assert case["speed_vs_hf_engine"] == pytest.approx(cases["hf_engine"]["median_s"] / case["median_s"])
    head = (1000, 64)  # the tiny shape's vocabulary x hidden size
    # the matmul floor's own F.linear calls: each [BATCH, in] activation with each weight, every step
    floor_calls = [s for s in shapes if s[0][0] == BATCH and len(s[0]) == 2]
    assert len(floor_calls) == 2 * NEW * (7 * 2 + 1)  # 2 timed calls, NEW steps, every matrix once
    assert floor_calls.count(((BATCH, 64), head)) == 2 * NEW
    assert matmuls["weight_bytes"] == reads["weight_bytes"] == 4 * sum(
        m.weight.numel() for m in bench.build(bench.parse_args(TINY))[0].modules() if isinstance(m, torch.nn.Linear))
