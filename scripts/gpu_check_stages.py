"""Stages 1-3 of scripts/gpu_check.py: which cases run, which the budget skips, what is written.

`Check` holds what the stages share: the `Budget`, the `Record` and an `Estimator` that learns
from each case how fast this machine is. Stage 1's ``--shapes`` cases always run (they are what
a lease is for); every other case runs only when its estimate fits the time left, else it is
recorded as skipped with the estimate and the time left. Before a ``--predict`` case runs, the
plan is calibrated on the measured cases (`ibpo_lit.plan.calibration`) and its prediction is
written to the JSON; the case's entry then holds the prediction's error.
"""
from __future__ import annotations

import gc
import os
import traceback
from pathlib import Path
from typing import Optional

from gpu_check_cases import UpdateGroup, gpu_memory, measured_figures, run_update_shape, run_whole_step, update_plan

GIB = 1024 ** 3
REPO = Path(__file__).resolve().parent.parent
SELF_TEST = "tests/scale/test_gpu.py::test_gpu_check_runs_on_the_gpu"  # runs this script: not again in stage 3


class Estimator:
    """Seconds a case will take. Until a case has run: the matmul probe at a fifth of its rate
    and a guessed setup; then the slowest rate and setup per parameter measured so far. A step
    computes 8N FLOPs a trained token (gradient checkpointing recomputes the forward)."""

    def __init__(self, probe_tflops: float) -> None:
        self.probe_tflops = probe_tflops
        self.tflops: Optional[float] = None
        self.setup_s_per_param: Optional[float] = None

    def learn(self, params: int, tokens_per_step: float, step_s: float, setup_s: Optional[float]) -> None:
        rate = 8 * params * tokens_per_step / step_s / 1e12
        self.tflops = rate if self.tflops is None else min(self.tflops, rate)
        if setup_s:
            per_param = setup_s / params
            self.setup_s_per_param = max(self.setup_s_per_param or 0.0, per_param)

    def setup_s(self, params: int) -> float:
        return self.setup_s_per_param * params if self.setup_s_per_param else 10.0 + params / 1e8

    def step_s(self, params: int, tokens: int) -> float:
        return 8 * params * tokens / ((self.tflops or self.probe_tflops / 5) * 1e12)

    def update_case(self, params: int, group: UpdateGroup, with_setup: bool) -> float:
        steps = (group.warmup + group.steps) * self.step_s(params, group.rows * group.row_tokens)
        return (self.setup_s(params) if with_setup else 0.0) + 1.2 * steps + 5.0


class Check:
    def __init__(self, args, budget, record, env) -> None:
        self.args, self.budget, self.record, self.env = args, budget, record, env
        self.on_gpu = args.device == "cuda"
        self.estimator = Estimator(env["matmul_tflops"])
        self.plans: dict[str, dict] = {}
        self.decisions: dict[str, dict] = {}  # a started case's entry so far, by name
        # the --shapes x --row-tokens cases: always run, and the calibration's
        self.required = {f"update/{shape}/{length}" for shape in args.shapes for length in args.row_tokens}
        self.measured: list = []  # calibration's UpdateCase of every measured --shapes case
        self.calibration = None  # a Calibration, once fitted
        self.calibrated = False

    # ------------------------------------------------------------------ stage 1
    def stage1(self) -> None:
        a = self.args
        groups: dict[str, list[UpdateGroup]] = {}
        for shapes, lengths in ((a.shapes, a.row_tokens), (a.predict, a.predict_row_tokens)):
            for shape in shapes:
                for length in lengths:
                    name = f"update/{shape}/{length}"
                    if all(g.name != name for gs in groups.values() for g in gs):
                        groups.setdefault(shape, []).append(UpdateGroup(
                            name, shape, length, a.prompt_tokens, a.rows, a.micro_batch_size, a.warmup, a.steps))
        for shape, pending in groups.items():
            while pending and not self._decide(pending[0], with_setup=True):
                pending = pending[1:]
            if not pending:
                continue
            first = pending[0]
            try:
                driver = run_update_shape(shape, pending, a, lambda g: g is first or self._decide(g, False), self._ended)
                if "seconds_to_first_step" not in self.env and driver.first_step_end is not None:
                    self.env["seconds_to_first_step"] = driver.first_step_end - self.budget.start
                    self.record.write()
            except Exception as e:  # the case running failed; the model's later cases did not run
                reason = f"{type(e).__name__}: {e}"
                recorded = {c["name"] for c in self.record.data["cases"]}
                for g in pending:
                    if g.name in recorded:
                        continue
                    if g.name in self.decisions:
                        self.record.case({**self.decisions[g.name], "status": "failed", "reason": reason[:2000],
                                          "traceback": traceback.format_exc()[-4000:]})
                    elif g.name not in self.decisions:
                        self.record.case({"name": g.name, "stage": 1, "status": "skipped",
                                          "reason": f"not run: an earlier case of {shape} failed"})
            finally:
                gc.collect()
                if self.on_gpu:
                    import torch

                    torch.cuda.empty_cache()

    def _plan(self, group: UpdateGroup) -> dict:
        if group.name not in self.plans:
            memory = self.env.get("memory_at_start") or {}
            self.plans[group.name] = update_plan(group.shape, group, self.args, memory.get("total_gib"),
                                                 self.env["peak_tflops"])
        return self.plans[group.name]

    def _decide(self, group: UpdateGroup, with_setup: bool) -> bool:
        """Whether ``group`` runs now; a skipped one is recorded with the reason."""
        plan = self._plan(group)
        estimate = self.estimator.update_case(plan["model"].params, group, with_setup)
        entry = {"name": group.name, "stage": 1, "estimate_s": estimate, "time_left_s": self.budget.left()}
        if group.name not in self.required:  # a predicted case: the prediction comes first
            prediction = self._predict(group, plan)
            total = (self.env.get("memory_at_start") or {}).get("total_gib")
            if total and prediction["device_gib"] > total:
                self.record.case({**entry, "status": "skipped", "reason": f"predicted {prediction['device_gib']:.1f} "
                                  f"GiB of the GPU's {total:.1f}"})
                return False
            if not self.budget.fits(estimate):
                self.record.case({**entry, "status": "skipped", "reason": f"estimated {estimate:.0f} s, "
                                  f"{self.budget.left():.0f} s left"})
                return False
        entry["started_after_s"] = self.budget.elapsed()
        self.decisions[group.name] = entry
        return True

    def _ended(self, group: UpdateGroup, figures: dict) -> None:
        from ibpo_lit.plan.calibration import UpdateCase

        plan = self._plan(group)
        entry = {**self.decisions[group.name], "status": "ran", "wall_s": self.budget.elapsed()
                 - self.decisions[group.name]["started_after_s"],
                 "rows": group.rows, "row_tokens": group.row_tokens, "prompt_tokens": group.prompt_tokens,
                 "micro_batch_size": group.micro_batch_size, "warmup": group.warmup, "steps": group.steps,
                 "params": figures["params"], "measured": self._measured(group, figures, plan["model"]),
                 "plan": {k: v for k, v in plan.items() if k != "model"}}
        peak = entry["measured"]["peak_allocated_gib"]
        prediction = self.record.data["predictions"].get(group.name)
        if prediction is not None and peak:
            errors = {k: (prediction[k] - peak) / peak for k in ("peak_allocated_gib", "uncalibrated_peak_allocated_gib")}
            entry["prediction_error"] = errors
            entry["prediction_within_15_percent"] = abs(errors["peak_allocated_gib"]) <= 0.15
        if group.name in self.required and peak:
            self.measured.append(UpdateCase(group.name, **plan["moments"], measured=peak * GIB))
        self.record.case(entry)
        self.estimator.learn(figures["params"], figures["trained_tokens_per_step"], figures["mean_step_s"],
                             figures["setup_s"])
        m = entry["measured"]
        memory = f", peak {peak:.2f} GiB (plan {plan['peak_allocated_gib']:.2f})" if peak else ""
        mfu = f", MFU {m['mfu']:.1%}" if m["mfu"] is not None else ""
        print(f"{group.name}: {m['seconds_per_step']:.2f} s/step (plan {plan['update_s']:.2f}), "
              f"{m['trained_tokens_per_s']:.0f} trained tok/s{mfu}{memory}", flush=True)

    def _measured(self, group: UpdateGroup, figures: dict, model) -> dict:
        outside = (self.env.get("memory_at_start") or {}).get("outside_allocator_gib")
        return measured_figures(group, figures, model, self.env["peak_tflops"], outside)

    def _predict(self, group: UpdateGroup, plan: dict) -> dict:
        """The calibrated plan's peak for ``group``, written to the JSON before the case may run."""
        from ibpo_lit.plan.calibration import UpdateCase, fit, predict

        if group.name in self.record.data["predictions"]:
            return self.record.data["predictions"][group.name]
        if not self.calibrated:
            self.calibrated = True
            self.calibration = fit(self.measured) if self.measured else None
            self.record.set("calibration", self._calibration_record())
        case = UpdateCase(group.name, **plan["moments"])
        uncalibrated = predict(case) / GIB
        out = {"uncalibrated_peak_allocated_gib": uncalibrated, "written_after_s": self.budget.elapsed()}
        overhead = (self.record.data["calibration"] or {}).get("overhead_measured")
        if self.calibration is not None and overhead:
            out["peak_allocated_gib"] = self.calibration.predict(case) / GIB
            out["peak_reserved_gib"] = out["peak_allocated_gib"] + overhead["allocator_slack_gib"]
            out["device_gib"] = out["peak_reserved_gib"] + overhead["outside_allocator_gib"]
        else:  # nothing measured (the CPU): the plan as it stands
            out["peak_allocated_gib"] = uncalibrated
            out["device_gib"] = plan["device_gib"]
        self.record.data["predictions"][group.name] = out
        self.record.write()
        return out

    def _calibration_record(self) -> dict:
        if self.calibration is None:
            return {"skipped": "no case with a measured peak (no device memory statistics on the CPU)"}
        ran = [c for c in self.record.data["cases"] if c.get("status") == "ran" and c["stage"] == 1]
        slack = max(c["measured"]["peak_reserved_gib"] - c["measured"]["peak_allocated_gib"] for c in ran
                    if c["measured"]["peak_reserved_gib"] is not None)
        return {**self.calibration.as_dict(),
                "constants": "activation_factor multiplies the update's backward transients (activations, the log-prob "
                             "head's chunk, gathered units); reserve_gib is fixed beside them "
                             "(ibpo_lit/plan/calibration.py)",
                "overhead_measured": {"allocator_slack_gib": slack, "outside_allocator_gib": self._outside_allocator_gib(),
                                      "note": "the plan's overhead_gib on one GPU = outside_allocator_gib "
                                              "(CUDA context, library handles) + allocator_slack_gib (reserved - "
                                              "allocated); NCCL buffers of many GPUs are not in it"}}

    def _outside_allocator_gib(self) -> Optional[float]:
        """What this process holds on the GPU outside torch's allocator, now (after stage 1 has
        loaded cuBLAS and cuDNN); stage 0's figure where no GPU is measured."""
        if self.on_gpu:
            return gpu_memory()["outside_allocator_gib"]
        return (self.env.get("memory_at_start") or {}).get("outside_allocator_gib")

    # ------------------------------------------------------------------ stage 2
    def stage2(self) -> None:
        from gpu_check_cases import model_config

        a = self.args
        name = f"step/{a.step_shape}"
        config = model_config(a.step_shape)
        params = _params(config)
        decode_s = 2 * a.max_new_tokens * (0.06 if self.on_gpu else 0.02)  # rollouts and corrections, HF engine
        update = self.estimator.step_s(params, a.prompts * a.group_size * (256 + 2 * a.max_new_tokens))
        estimate = self.estimator.setup_s(params) + 2 * (decode_s + update) + 10.0
        entry = {"name": name, "stage": 2, "estimate_s": estimate, "time_left_s": self.budget.left()}
        if not self.budget.fits(estimate):
            self.record.case({**entry, "status": "skipped", "reason": f"estimated {estimate:.0f} s, "
                              f"{self.budget.left():.0f} s left"})
            return
        start = self.budget.elapsed()
        figures = run_whole_step(a.step_shape, a, a.prompts, a.group_size, a.max_new_tokens, steps=1, warmup=1)
        peak = self.env["peak_tflops"] * 1e12
        figures["update_mfu"] = figures["update_tflops"] * 1e12 / peak
        self.record.case({**entry, "status": "ran", "wall_s": self.budget.elapsed() - start,
                          "measured": {k: v for k, v in figures.items() if k != "plan_peak_allocated_gib"},
                          "plan": {"peak_allocated_gib": figures["plan_peak_allocated_gib"]}})
        memory = figures["memory"]
        print(f"{name}: {figures['step_s']:.2f} s/step ({figures['update_s']:.2f} s update), "
              f"{figures['generated_tokens_per_s']:.0f} generated tok/s, update MFU {figures['update_mfu']:.1%}"
              + (f", peak {memory['peak_allocated_gib']:.2f} GiB" if memory else ""), flush=True)

    # ------------------------------------------------------------------ stage 3
    def stage3(self) -> None:
        import pytest

        files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                       if "mark.gpu" in p.read_text())
        imports = sum(v for k, v in self.env["imports"].items() if k.endswith("_s"))
        estimate = 1.5 * imports + (60.0 if self.on_gpu else 30.0)  # a test that starts its own process pays imports
        entry = {"name": "pytest -m gpu", "stage": 3, "estimate_s": estimate, "time_left_s": self.budget.left(),
                 "files": files, "deselected": [SELF_TEST]}
        if not self.budget.fits(estimate):
            self.record.case({**entry, "status": "skipped", "reason": f"estimated {estimate:.0f} s, "
                              f"{self.budget.left():.0f} s left"})
            return
        collect = _Reports()
        start, cwd = self.budget.elapsed(), os.getcwd()
        os.chdir(REPO)
        try:
            # -n 0: in this process, one test after another (the suite's own default is parallel workers)
            code = pytest.main(["-q", "-n", "0", "-m", "gpu", "-p", "no:cacheprovider", "--deselect", SELF_TEST, *files],
                               plugins=[collect])
        finally:
            os.chdir(cwd)
        self.record.case({**entry, "status": "ran", "wall_s": self.budget.elapsed() - start, "exit_code": int(code),
                          "tests": collect.tests})
        print(f"pytest -m gpu: exit {int(code)}, " + ", ".join(f"{t['outcome']} {t['nodeid']}" for t in collect.tests),
              flush=True)


class _Reports:
    """Each test's outcome, duration and (failed) report, as pytest gives them."""

    def __init__(self) -> None:
        self.tests: list[dict] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed) or (report.failed):
            if any(t["nodeid"] == report.nodeid and t["outcome"] == "failed" for t in self.tests):
                return
            self.tests.append({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                               "duration_s": report.duration,
                               "report": str(report.longrepr)[-3000:] if report.failed else None})


def _params(config) -> int:
    """Parameters of a Qwen3 config (built on the meta device)."""
    import torch
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())
