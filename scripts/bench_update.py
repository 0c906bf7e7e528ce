"""How fast ibpo-lit's update runs on one GPU under each of its speed settings, side by side.

    python scripts/bench_update.py --budget-s 300                 # on the GPU machine (after gpu_check)
    python scripts/bench_update.py --device cpu --shape tiny --row-tokens 96 --prompt-tokens 16 \\
        --rows 4 --variants stage1 no_checkpointing                 # the same code on the CPU

The update alone on fixed token rows, as stage 1 of scripts/gpu_check.py measures it (the same
`UpdateDriver`, ``IBPOModule``'s own ``PolicyUpdate`` under FSDP2 and bf16-mixed, MFU as 6N per
trained token with recomputation not counted, forward + backward + optimizer step timed), once
per *variant*: a set of the module's settings (gradient checkpointing, the log-prob head's chunk,
AdamW's fused kernel, ``model.torch_compile``) and the micro-batch size. Every variant trains the
same rows from the same seed, so their losses and gradient norms agree to bf16 rounding
(recorded: a variant that changed the work would show). The ``stage1`` variant is the check's own
setting, the baseline the others are compared with in the same run.

``--profile`` variants run again, each timed step under ``torch.profiler``: their device time by
kernel family (matmul, attention, optimizer, the rest) is recorded; their seconds are not
quoted. A variant whose estimate (the slowest step so far, plus a compilation's allowance) does
not fit the budget's time left is skipped and the JSON says so. The JSON
(``results/bench_update/<device>_<date>.json`` or ``--out-dir``) is written after every variant.
"""
from __future__ import annotations

import time

T_SCRIPT = time.time()

import argparse  # noqa: E402
import gc  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from gpu_check_record import Budget, Record  # noqa: E402

# name: (the module's settings over stage 1's, micro-batch size or None for --micro-batch-size)
VARIANTS = {
    "stage1": ({}, None),
    "no_checkpointing": ({"gradient_checkpointing": False}, None),
    "no_checkpointing_whole_head": ({"gradient_checkpointing": False, "logprob_chunk_tokens": None}, None),
    "fused_adamw": ({"gradient_checkpointing": False, "logprob_chunk_tokens": None, "fused": True}, None),
    "compiled": ({"gradient_checkpointing": False, "logprob_chunk_tokens": None, "fused": True,
                  "torch_compile": True}, None),
    "compiled_checkpointing": ({"fused": True, "torch_compile": True}, None),
    "compiled_micro_batch_1": ({"gradient_checkpointing": False, "logprob_chunk_tokens": None, "fused": True,
                                "torch_compile": True}, 1),
    "checkpointing_micro_batch_4": ({"fused": True, "torch_compile": True}, 4),
    "compiled_chunked_head": ({"gradient_checkpointing": False, "fused": True, "torch_compile": True}, None),
    "compiled_checkpointing_whole_head": ({"logprob_chunk_tokens": None, "fused": True, "torch_compile": True}, None),
}
COMPILE_ALLOWANCE_S = 120.0
"""What a compiled variant's first steps may add (inductor on the GPU machine's 16 cores)."""
KERNEL_FAMILIES = (  # (family, pattern of the kernel's name), first match wins
    ("attention", r"flash|fmha|attention|sdpa|cudnn"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|matmul|sm90|sm100|aten::(addmm|mm|bmm|linear)$"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("collective or copy", r"nccl|memcpy|memset|copy|cat_|CatArray|gather|scatter|index"),
)


def parse_args(argv):
    from gpu_check_cases import SHAPES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--budget-s", type=float, default=300.0, help="seconds from the process's start it may use")
    p.add_argument("--shape", default="qwen3-1.7b", choices=sorted(SHAPES))
    p.add_argument("--row-tokens", type=int, default=8192)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--rows", type=int, default=8, help="rows a step trains (one optimizer step)")
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="untimed steps (compiled variants: at least 2)")
    p.add_argument("--steps", type=int, default=2, help="timed steps a variant")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--profile", nargs="*", default=["stage1", "compiled"], choices=list(VARIANTS),
                   help="variants run again under torch.profiler (after every timed one, as time allows)")
    p.add_argument("--precision", default=None, help="default: bf16-mixed on a GPU, 32-true on the CPU")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of an unlisted device")
    p.add_argument("--out-dir", type=Path, default=REPO / "results" / "bench_update")
    args = p.parse_args(argv)
    if args.row_tokens <= args.prompt_tokens:
        p.error("--row-tokens must exceed --prompt-tokens (a row holds a response)")
    args.precision = args.precision or ("bf16-mixed" if args.device == "cuda" else "32-true")
    return args


def kernel_families(profile, on_gpu: bool) -> dict:
    """Device time (ms) by kernel family, and the 12 slowest kernels, of a ``torch.profiler`` run
    (on the CPU: operators' own CPU time)."""
    families: dict[str, float] = {}
    kernels = []
    for event in profile.key_averages():
        us = getattr(event, "self_device_time_total", 0.0) if on_gpu else event.self_cpu_time_total
        if not us:
            continue
        family = next((f for f, pattern in KERNEL_FAMILIES if re.search(pattern, event.key, re.I)), "other")
        families[family] = families.get(family, 0.0) + us / 1e3
        kernels.append({"kernel": event.key[:160], "ms": us / 1e3, "calls": event.count, "family": family})
    kernels.sort(key=lambda k: -k["ms"])
    return {"families_ms": families, "total_ms": sum(families.values()), "top": kernels[:12]}


def profiling_driver():
    import torch

    from gpu_check_cases import UpdateDriver

    class ProfilingDriver(UpdateDriver):
        """An `UpdateDriver` whose timed steps run under ``torch.profiler``."""

        profiles: list = []

        def step(self, module) -> None:
            run = self.running
            if run is None or len(run.seconds) < run.group.warmup:
                return super().step(module)
            activities = [torch.profiler.ProfilerActivity.CUDA if self.on_gpu else torch.profiler.ProfilerActivity.CPU]
            with torch.profiler.profile(activities=activities) as profile:
                super().step(module)
            ProfilingDriver.profiles.append(kernel_families(profile, self.on_gpu))

    return ProfilingDriver


def main(argv=None) -> dict:
    from gpu_check import bench_record

    args = parse_args(argv)
    defined = {k: {"settings": v[0], "micro_batch_size": v[1] or args.micro_batch_size} for k, v in VARIANTS.items()}
    budget, env, record = bench_record(args, argv, {"variants_defined": defined})
    out = record.path
    print(f"bench_update: {env['device']}, {args.shape} x {args.rows} rows of {args.row_tokens} tokens, "
          f"matmul {env['matmul_tflops']:.3g} TFLOP/s, writing {out}", flush=True)
    slowest = {"step_s": None}
    runs = [(name, False) for name in args.variants] + [(name, True) for name in args.profile]
    for name, profiled in runs:
        run_variant(name, profiled, args, budget, record, env, slowest)
    baseline = next((c for c in record.data["cases"] if c["name"] == "stage1" and c["status"] == "ran"), None)
    if baseline is not None:
        for case in record.data["cases"]:
            if case["status"] == "ran" and not case.get("profiled"):
                case["speedup_vs_stage1"] = baseline["measured"]["seconds_per_step"] / case["measured"]["seconds_per_step"]
    record.data["elapsed_s"] = budget.elapsed()
    record.write(complete=True)
    print(f"done in {budget.elapsed():.0f} s of {args.budget_s:.0f} -> {out}", flush=True)
    return record.data


def run_variant(name: str, profiled: bool, args, budget: Budget, record: Record, env: dict, slowest: dict) -> None:
    from gpu_check_cases import UpdateGroup, model_config, run_update_shape
    from ibpo_lit.plan.shapes import ModelShape

    settings, micro = VARIANTS[name]
    compiled = settings.get("torch_compile", False)
    warmup = max(args.warmup, 2) if compiled else args.warmup
    group = UpdateGroup(name, args.shape, args.row_tokens, args.prompt_tokens, args.rows, micro or args.micro_batch_size,
                        warmup, args.steps)
    label = f"{name} (profiled)" if profiled else name
    entry = {"name": label, "variant": name, "profiled": profiled, "settings": settings,
             "micro_batch_size": group.micro_batch_size, "warmup": warmup, "steps": args.steps}
    if slowest["step_s"] is not None:
        estimate = (warmup + args.steps) * slowest["step_s"] + 10.0 + (COMPILE_ALLOWANCE_S if compiled else 0.0)
        entry["estimate_s"] = estimate
        if not budget.fits(estimate):
            record.case({**entry, "status": "skipped", "reason": f"estimated {estimate:.0f} s, {budget.left():.0f} s left"})
            print(f"{label}: skipped (estimated {estimate:.0f} s, {budget.left():.0f} s left)", flush=True)
            return
    started = budget.elapsed()
    done: dict = {}
    driver_class = profiling_driver() if profiled else None
    try:
        kwargs = {"driver_class": driver_class} if driver_class is not None else {}
        if driver_class is not None:
            driver_class.profiles = []
        run_update_shape(args.shape, [group], args, lambda g: True, lambda g, figures: done.update(figures),
                         settings=settings, **kwargs)
    except Exception as e:  # one variant's failure (memory, a compile error) is a finding: the next runs
        record.case({**entry, "status": "failed", "reason": f"{type(e).__name__}: {e}"[:2000],
                     "traceback": traceback.format_exc()[-4000:]})
        print(f"{label}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return
    finally:
        gc.collect()
        if args.device == "cuda":
            import torch

            torch.cuda.empty_cache()
    from gpu_check_cases import measured_figures

    outside = (env.get("memory_at_start") or {}).get("outside_allocator_gib")
    measured = measured_figures(group, done, ModelShape.from_config(model_config(args.shape)), env["peak_tflops"],
                                outside)
    entry.update(status="ran", wall_s=budget.elapsed() - started, measured=measured)
    if profiled:
        entry["profiles"] = driver_class.profiles
    else:
        slowest["step_s"] = max(slowest["step_s"] or 0.0, max(done["step_s"]), *done["warmup_s"][-1:])
    record.case(entry)
    memory = f", peak {measured['peak_allocated_gib']:.1f} GiB" if measured["peak_allocated_gib"] else ""
    first = f", warm-up {sum(done['warmup_s']):.1f} s"
    print(f"{label}: {measured['seconds_per_step']:.3f} s/step, MFU {measured['mfu']:.1%} "
          f"(with attention {measured['mfu_with_attention']:.1%}){memory}{first}, "
          f"grad norms {[round(g, 4) for g in measured['grad_norms']]}", flush=True)


if __name__ == "__main__":
    main()
