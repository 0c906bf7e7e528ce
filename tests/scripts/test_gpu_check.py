"""scripts/gpu_check.py on the CPU, with tiny shapes and rows (the GPU machine runs the same code with
Qwen3 shapes): the stages, the budget that skips what cannot finish, the JSON written after every
case, and the calibration that predicts a case before it runs."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["--device", "cpu", "--shapes", "tiny", "--row-tokens", "48", "96", "--prompt-tokens", "16", "--rows", "4",
        "--predict", "tiny-wide", "--predict-row-tokens", "96", "--step-shape", "tiny", "--max-new-tokens", "8",
        "--prompts", "2", "--group-size", "2"]


def run_check(out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """The check in its own process; every version of its JSON seen while it ran."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "scripts/gpu_check.py", *TINY, "--out", str(out), *extra], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, last = [], None
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if out.exists() and out.stat().st_mtime_ns != last:
            last = out.stat().st_mtime_ns
            seen.append(json.loads(out.read_text()))  # replaced whole, never half-written
        time.sleep(0.01)
    stdout, stderr = proc.communicate(timeout=60)
    seen.append(json.loads(out.read_text()))
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), seen


def test_a_short_budget_runs_the_required_cases_writes_as_it_goes_and_skips_the_rest(tmp_path):
    out = tmp_path / "check.json"
    done, seen = run_check(out, "--budget-s", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    final = seen[-1]
    # the --shapes cases always run; what cannot finish in the time left is skipped, with why
    assert final["complete"] and final["ran"] == ["update/tiny/48", "update/tiny/96"]
    assert [s["name"] for s in final["skipped"]] == ["update/tiny-wide/96", "step/tiny", "pytest -m gpu"]
    assert all("s left" in s["reason"] for s in final["skipped"])
    # written after the first case, before the run was complete
    assert any(not s["complete"] and s["ran"] == ["update/tiny/48"] for s in seen[:-1])
    for case in final["cases"]:
        if case["status"] != "ran":
            continue
        measured, plan = case["measured"], case["plan"]
        assert measured["seconds_per_step"] > 0 and measured["trained_tokens_per_s"] > 0 and 0 < measured["mfu"] < 1
        assert measured["trained_tokens_per_step"] == 4 * case["row_tokens"]  # every token of every row trained
        assert measured["attention_tflop_per_step"] > 0 and measured["grad_norms"][0] > 0
        assert measured["peak_allocated_gib"] is None  # no device memory statistics on the CPU ...
        assert plan["peak_allocated_gib"] > 0 and plan["update_s"] > 0 and plan["mfu"] == 0.3  # ... the plan's beside
        assert set(plan["moments"]) == {"state", "backward", "step"}
    # the skipped case's prediction was written (the plan as it stands: nothing measured to calibrate on)
    assert final["predictions"]["update/tiny-wide/96"]["peak_allocated_gib"] > 0
    assert "skipped" in final["calibration"]
    stage0 = final["stage0"]
    assert stage0["seconds_to_first_step"] > stage0["seconds_to_imports_done"] > 0
    assert final["device"] == "cpu" and final["date"] and final["git_commit"] and final["process"]["one_process"]
    assert "update/tiny/48:" in done.stdout and "skipped 3" in done.stdout


@pytest.mark.slow
def test_every_stage_runs_on_the_cpu_with_time_to_spare(tmp_path):
    done, seen = run_check(tmp_path / "check.json", "--budget-s", "600")
    assert done.returncode == 0, done.stderr[-3000:]
    final = seen[-1]
    assert final["ran"] == ["update/tiny/48", "update/tiny/96", "update/tiny-wide/96", "step/tiny", "pytest -m gpu"]
    step = next(c for c in final["cases"] if c["name"] == "step/tiny")
    assert step["measured"]["step_s"] > 0 and set(step["plan"]["peak_allocated_gib"]) == {"rollout", "corrections",
                                                                                            "update"}
    tests = next(c for c in final["cases"] if c["name"] == "pytest -m gpu")
    assert tests["exit_code"] == 0 and tests["tests"] and all(t["outcome"] == "skipped" for t in tests["tests"])


def test_the_calibration_predicts_a_case_before_it_runs(tmp_path, load_script, monkeypatch):
    """The stages' bookkeeping without a fit: the device's peaks are made by a known rule from each
    case's planned moments (peak = state + max(1.25 backward, step) + 0.25 GiB, what no CPU can
    measure); the check must fit that rule, write the predicted case's peak before the case runs,
    and find it right when the case's peak follows the same rule."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    gpu_check = load_script("gpu_check")
    from gpu_check_cases import UpdateGroup
    from gpu_check_record import Budget, Record
    from gpu_check_stages import Check

    args = gpu_check.parse_args(TINY)
    gib = 1024 ** 3
    env = {"matmul_tflops": 0.05, "peak_tflops": 0.05,
           "memory_at_start": {"total_gib": 80.0, "free_gib": 79.0, "outside_allocator_gib": 0.5}}
    record = Record(tmp_path / "check.json", {})
    # counted from now: by default a Budget counts from the process's start, and this test may run
    # 40 minutes into a pytest session (CI found it refusing the case for want of time)
    check = Check(args, Budget(1000.0, start=time.time()), record, env)

    def ran(group):
        assert check._decide(group, with_setup=True)
        plan = check._plan(group)
        m = plan["moments"]
        peak = (m["state"] + max(1.25 * m["backward"], m["step"])) / gib + 0.25
        check._ended(group, {"params": plan["model"].params, "trained_tokens_per_step": 384.0, "mean_step_s": 0.1,
                             "setup_s": 1.0, "step_s": [0.1], "warmup_s": [0.1], "warmup_memory": None, "losses": [0.0],
                             "grad_norms": [1.0], "memory": {"peak_allocated_gib": peak, "peak_reserved_gib": peak + 0.1}})
        return peak

    for length in (48, 96):
        ran(UpdateGroup(f"update/tiny/{length}", "tiny", length, 16, 4, 2, 1, 2))
    target = UpdateGroup("update/tiny-wide/96", "tiny-wide", 96, 16, 4, 2, 1, 2)
    assert check._decide(target, with_setup=True)
    calibration = record.data["calibration"]
    assert calibration["activation_factor"] == pytest.approx(1.25) and calibration["reserve_gib"] == pytest.approx(0.25)
    assert calibration["overhead_measured"]["allocator_slack_gib"] == pytest.approx(0.1)
    prediction = record.data["predictions"][target.name]  # written before the case ran
    measured = ran(target)
    assert prediction["peak_allocated_gib"] == pytest.approx(measured)
    assert prediction["device_gib"] == pytest.approx(measured + 0.1 + 0.5)  # + the allocator's slack + the context
    entry = record.data["cases"][-1]
    assert entry["prediction_within_15_percent"] and abs(entry["prediction_error"]["peak_allocated_gib"]) < 1e-6
    # a prediction beyond the GPU's memory skips the case
    env["memory_at_start"]["total_gib"] = prediction["device_gib"] / 2
    check.record.data["predictions"].clear()
    assert not check._decide(target, with_setup=True)
    assert record.data["skipped"][-1]["reason"].startswith("predicted")


def test_the_update_cases_plan_has_no_padded_masks_for_their_rows_of_one_length(load_script, monkeypatch):
    """Stage 1's rows are all one length, so SDPA gets no mask: the plan's padded-mask part, which
    a real run's micro-batches of 2+ rows carry (plan/memory.py), is taken out of the case's
    moments (what the calibration fits), its parts and its predicted peak."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    gpu_check = load_script("gpu_check")
    from gpu_check_cases import UpdateGroup, update_plan

    from ibpo_lit.plan import memory
    from ibpo_lit.plan.plan import PlanSettings, build_plan

    args = gpu_check.parse_args(TINY)
    group = UpdateGroup("update/tiny/96", "tiny", 96, 16, 4, 2, 1, 2)  # micro-batches of 2 rows
    plan = update_plan("tiny", group, args, 80.0, 100.0)
    assert memory.PADDED_MASKS not in plan["parts_gib"]
    # the plan of a real run with these settings does count them
    real = memory.backward_transients(plan["model"], _run_of(plan, args, group), 96)
    padded = real[memory.PADDED_MASKS]
    assert padded == 2 * 96 ** 2 * (1 + 4 * 1)  # the bool mask, one fp32 copy (stage 1 checkpoints: one layer's)
    assert plan["moments"]["backward"] == pytest.approx(sum(real.values()) - padded)
    whole = build_plan(plan["model"], _run_of(plan, args, group), PlanSettings(gpu_memory_gib=80.0, peak_tflops=100.0))
    update = next(p for p in whole.phases if p.name == "update")
    assert plan["device_gib"] == pytest.approx((update.total - padded) / 1024 ** 3)


def _run_of(plan, args, group):
    from types import SimpleNamespace

    from gpu_check_cases import update_module

    from ibpo_lit.plan.run import RunShape

    trainer = SimpleNamespace(accelerator="cpu", devices=1, num_nodes=1, strategy="fsdp2", precision=args.precision)
    return RunShape.from_fit(update_module("tiny", group), SimpleNamespace(prompts_per_step=1,
                                                                     max_prompt_tokens=group.prompt_tokens), trainer)


def test_the_record_is_replaced_whole(tmp_path, load_script, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from gpu_check_record import Record

    record = Record(tmp_path / "r.json", {"device": "cpu"})
    record.case({"name": "a", "status": "ran"})
    before = (tmp_path / "r.json").read_text()
    record.data["bad"] = object()  # cannot be written: the last good version stays, no temporary is left
    with pytest.raises(TypeError):
        record.write()
    assert (tmp_path / "r.json").read_text() == before and os.listdir(tmp_path) == ["r.json"]
    assert json.loads(before)["ran"] == ["a"] and json.loads(before)["complete"] is False


def test_the_commit_named_is_ibpo_commit_when_set_not_a_stale_git(load_script, monkeypatch):
    """On the GPU machine the working tree travels with an old ``.git``: its HEAD is not the code
    that ran, so the session's IBPO_COMMIT wins; without it, git's HEAD here."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import gpu_check

    monkeypatch.setenv("IBPO_COMMIT", "0123abc")
    assert gpu_check.commit() == {"git_commit": "0123abc", "git_dirty": None}
    monkeypatch.delenv("IBPO_COMMIT")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:
        assert gpu_check.commit()["git_commit"] == head.stdout.strip()


def test_gpu_check_refuses_a_machine_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--shapes", "tiny", "--out", str(tmp_path / "x.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stderr


@pytest.mark.slow
def test_the_session_script_writes_the_check_under_out(tmp_path):
    """scripts/gpu_session.sh, the GPU session's one command, on the CPU (no wheels: the GPU
    machine's, built for its Python, may lie in this checkout's .whl/)."""
    env = {**os.environ, "OUT": str(tmp_path), "IBPO_BUDGET_S": "1", "OMP_NUM_THREADS": "1",
           "IBPO_WHEELS": str(tmp_path / "no_wheels")}
    done = subprocess.run(["bash", "scripts/gpu_session.sh", *TINY[:11], "--predict"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (result,) = [json.loads(p.read_text()) for p in tmp_path.glob("cpu_*.json")]
    assert result["complete"] and result["ran"] == ["update/tiny/48", "update/tiny/96"]
    assert "import time:" in (tmp_path / "gpu_check_stderr.txt").read_text()  # the import tree comes back
    assert "update/tiny/48:" in (tmp_path / "gpu_check_stdout.txt").read_text() and "exit 0" in done.stdout


def test_the_built_model_computes_its_rotary_buffers_not_garbage(load_script):
    """build_model fills an empty model: its weights from the seed, its rotary buffers (not
    parameters) computed as the model's own constructor does. Left as to_empty's memory they
    once read NaN and failed tests/scripts/test_bench_packing.py in a long CI process."""
    import torch
    from transformers import Qwen3ForCausalLM

    cases = load_script("gpu_check_cases")
    built, constructed = cases.build_model("tiny"), Qwen3ForCausalLM(cases.model_config("tiny"))
    buffers = dict(constructed.named_buffers())
    assert set(dict(built.named_buffers())) == set(buffers)
    for name, buffer in built.named_buffers():
        assert torch.equal(buffer, buffers[name]), name
