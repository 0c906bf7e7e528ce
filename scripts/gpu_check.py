"""What one GPU does with ibpo-lit's update and step, in stages, within a time budget.

    python scripts/gpu_check.py --budget-s 480                     # on the GPU machine (scripts/gpu_session.sh)
    python scripts/gpu_check.py --device cpu --shapes tiny --row-tokens 48 96 --prompt-tokens 16 --rows 4 \\
        --predict tiny-wide --predict-row-tokens 96 --step-shape tiny --max-new-tokens 8   # the same code, CPU

Stages, in this order, all in this one process (start-up is paid once; stage 3's fit test starts
its own):

0. the environment: versions, the GPU, its free memory and the CUDA context's size, a matmul's
   TFLOP/s, how long the imports took (and the custom-op registrations inside them), whether
   sources were compiled; then the seconds from the process's start to its first update step;
1. the update alone on fixed token rows (no rollouts) through ``IBPOModule``'s own update under
   FSDP2 and the check's precision (bf16-mixed on a GPU), gradient checkpointing on: the
   ``--shapes`` (Qwen3-0.6B and -1.7B) at each of ``--row-tokens`` (2k and 8k), always run; then
   the plan is calibrated on their measured peaks (`ibpo_lit.plan.calibration`) and its
   prediction for each ``--predict`` case (Qwen3-4B at 8k) is written down before that case
   runs, as time and the GPU's memory allow. Each case: seconds per step, trained tokens/s, MFU
   (6N per trained token, recomputation not counted, over every micro-batch's forward and
   backward and the optimizer step; attention's FLOPs beside it), peak allocated and reserved
   memory, each beside the plan's figure;
2. one short whole step with the HF engine (rollouts, corrections, the update);
3. ``pytest -m gpu`` in this process (the test that runs this script is left out).

A case that cannot finish in the budget's time left (its estimate from what ran before) is
skipped, and the JSON says why; the JSON is written after every case (and atomically), so a run
cut off keeps what it measured. It records the project's commit (``IBPO_COMMIT`` when set: the
GPU machine's ``.git`` is stale; else ``git``'s), the device and the date; by default it is written to
``results/gpu_check/<device>_<date>.json``.

Models are Qwen3s built in code with the real shapes and random weights (no download); MFU is
against the device's dense bf16 peak (H100/H200 SXM: 989 TFLOP/s; ``--peak-tflops`` for others;
on the CPU, the matmul probe's rate).
"""
from __future__ import annotations

import time

T_SCRIPT = time.time()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from gpu_check_record import Budget, Record  # noqa: E402

BF16_PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1}
GIB = 1024 ** 3


def parse_args(argv):
    from gpu_check_cases import SHAPES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="seconds from the process's start the check may use; the --shapes cases always run")
    p.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3], choices=(1, 2, 3), help="stage 0 always runs")
    p.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "qwen3-1.7b"], choices=sorted(SHAPES),
                   help="stage 1's calibration shapes (always run)")
    p.add_argument("--row-tokens", type=int, nargs="+", default=[2048, 8192], help="their rows' lengths")
    p.add_argument("--predict", nargs="*", default=["qwen3-4b"], choices=sorted(SHAPES),
                   help="shapes the calibrated plan predicts before they run (as time allows)")
    p.add_argument("--predict-row-tokens", type=int, nargs="+", default=[8192])
    p.add_argument("--prompt-tokens", type=int, default=256, help="the prompt part of every row")
    p.add_argument("--rows", type=int, default=8, help="rows a step trains (one optimizer step)")
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2, help="timed steps a case")
    p.add_argument("--step-shape", default="qwen3-0.6b", choices=sorted(SHAPES), help="stage 2's model")
    p.add_argument("--prompts", type=int, default=4, help="stage 2: prompts a step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--precision", default=None, help="default: bf16-mixed on a GPU, 32-true on the CPU "
                   "(bf16 is emulated on CPUs without AVX-512 bf16)")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of an unlisted device")
    p.add_argument("--out", type=Path, default=None, help="the JSON file (default: --out-dir/<device>_<date>.json)")
    p.add_argument("--out-dir", type=Path, default=REPO / "results" / "gpu_check")
    args = p.parse_args(argv)
    if min(args.row_tokens + args.predict_row_tokens) <= args.prompt_tokens:
        p.error(f"every row must be longer than --prompt-tokens ({args.prompt_tokens}): it holds a response too")
    args.precision = args.precision or ("bf16-mixed" if args.device == "cuda" else "32-true")
    return args


def timed_imports(require_cuda: bool) -> dict:
    """Import what the cases use, one layer at a time, with the seconds each took (the process's
    first imports of torch, Lightning, transformers and ibpo-lit) and the custom operators torch
    registered on the way (issue 42: 0.26 s each on the GPU machine)."""
    out, start = {}, time.perf_counter()
    import torch
    from torch._library import custom_ops

    out["torch_s"] = time.perf_counter() - start
    if require_cuda and not torch.cuda.is_available():  # before the slower imports
        print("gpu_check.py: no CUDA device: run on a GPU machine, or pass --device cpu", file=sys.stderr)
        sys.exit(2)
    ops_after_torch = len(custom_ops.OPDEFS)
    register, later = custom_ops.CustomOpDef._register_to_dispatcher, []

    def timed_register(self, *a, **k):  # the ones registered after `import torch` (torch._dynamo's)
        t = time.perf_counter()
        try:
            return register(self, *a, **k)
        finally:
            later.append(time.perf_counter() - t)

    custom_ops.CustomOpDef._register_to_dispatcher = timed_register
    try:
        for key, names in (("lightning_s", ["lightning.pytorch"]), ("transformers_s", ["transformers"]),
                           ("ibpo_lit_s", ["ibpo_lit.module", "ibpo_lit.scale", "callbacks"])):
            t = time.perf_counter()
            for name in names:
                __import__(name)
            out[key] = time.perf_counter() - t
    finally:
        custom_ops.CustomOpDef._register_to_dispatcher = register
    out.update({
        "custom_ops_registered_by_import_torch": ops_after_torch,
        "custom_ops_registered_after": len(later), "custom_ops_after_s": sum(later),
        "torch_dynamo_imported": "torch._dynamo" in sys.modules,
        "torch_sources_compiled_ahead": os.path.exists(importlib.util.cache_from_source(torch.__file__)),
        "ibpo_lit_sources_compiled_ahead": os.path.exists(importlib.util.cache_from_source(
            str(REPO / "ibpo_lit" / "module.py"))),
    })
    return out


def matmul_tflops(device: str) -> float:
    """A square matmul's rate: bf16 8192 on a GPU, float32 512 on the CPU."""
    import torch

    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (512, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ a
    if device == "cuda":
        torch.cuda.synchronize()
    start, reps = time.perf_counter(), 5
    for _ in range(reps):
        a @ a
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - start) / 1e12


def sdpa_probe() -> dict:
    """Milliseconds a call of decode-like attention takes (bf16, 32 rows x 16 heads x 128, one
    query against its cache), when every call has a new cache length (as HF decoding has: a
    backend that builds a plan per shape pays it each time) and when the length repeats; with
    torch's default backends and with cuDNN's left out. Issue 42: the first 528 SDPA calls of a
    run took 10.9 s."""
    import statistics

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def calls(lengths) -> list[float]:
        out = []
        for n in lengths:
            q = torch.randn(32, 16, 1, 128, device="cuda", dtype=torch.bfloat16)
            kv = torch.randn(32, 16, n, 128, device="cuda", dtype=torch.bfloat16)
            torch.cuda.synchronize()
            start = time.perf_counter()
            F.scaled_dot_product_attention(q, kv, kv)
            torch.cuda.synchronize()
            out.append(1000 * (time.perf_counter() - start))
        return out

    result = {"cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
              "flash_sdp_enabled": torch.backends.cuda.flash_sdp_enabled()}
    without_cudnn = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    for label, backends, base in (("default", None, 300), ("without_cudnn", without_cudnn, 400)):
        with sdpa_kernel(backends) if backends else contextlib.nullcontext():
            new = calls(range(base, base + 40))
            same = calls([base] * 40)
        result[label] = {"new_shape_ms": {"first": new[0], "median": statistics.median(new), "max": max(new)},
                         "same_shape_ms": {"median": statistics.median(same[1:]), "max": max(same[1:])}}
    return result


def stage0(args, budget: Budget, imports: dict) -> dict:
    from gpu_check_cases import gpu_memory

    import lightning
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "lightning": lightning.__version__, "transformers": transformers.__version__,
           "cpus": os.cpu_count(), "imports": imports,
           "seconds_to_imports_done": time.time() - budget.start,
           "script_started_after_s": T_SCRIPT - budget.start}
    if args.device == "cuda":
        torch.zeros(1, device="cuda")  # the context
        props = torch.cuda.get_device_properties(0)
        nccl = torch.cuda.nccl.version()
        env.update(device=props.name, multiprocessors=props.multi_processor_count,
                   cudnn=torch.backends.cudnn.version(), nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple)
                   else str(nccl), memory_at_start=gpu_memory())
        try:  # a probe: its failure is a finding, not the check's end
            env["sdpa"] = sdpa_probe()
        except Exception as e:
            env["sdpa"] = {"error": f"{type(e).__name__}: {e}"}
    else:
        env["device"] = "cpu"
    env["matmul_tflops"] = matmul_tflops(args.device)
    peak = args.peak_tflops or next((v for k, v in BF16_PEAK_TFLOPS.items() if k in env["device"]), None)
    env["peak_tflops"], env["peak_source"] = (peak, "table or --peak-tflops") if peak else (env["matmul_tflops"],
                                                                                              "matmul probe")
    return env


def commit() -> dict:
    """The project's commit: ``IBPO_COMMIT`` when set (the GPU machine's checkout carries a stale
    ``.git``: the working tree travels, its history does not, so ``git rev-parse`` there named an
    older commit than the code that ran), else ``git``'s, else "unknown"."""
    if os.environ.get("IBPO_COMMIT"):
        return {"git_commit": os.environ["IBPO_COMMIT"], "git_dirty": None}
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=20)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=20)
        if head.returncode == 0:
            return {"git_commit": head.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"git_commit": os.environ.get("IBPO_COMMIT", "unknown"), "git_dirty": None}


def bench_record(args, argv, extra: dict) -> tuple[Budget, dict, Record]:
    """A GPU benchmark's start (scripts/bench_update.py, bench_decode.py): its budget, stage 0's
    environment and its JSON record under ``args.out_dir`` (<device>_<date>.json), headed as this
    check's is, with ``extra`` added to the header, written once."""
    budget = Budget(args.budget_s)
    env = stage0(args, budget, timed_imports(require_cuda=args.device == "cuda"))
    date = datetime.datetime.now(datetime.timezone.utc)
    out = args.out_dir / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', env['device'])}_{date:%Y-%m-%d}.json"
    record = Record(out, {"schema": 1, **commit(), "device": env["device"], "date": date.isoformat(timespec="seconds"),
                          "argv": sys.argv[1:] if argv is None else list(argv), "budget_s": args.budget_s,
                          **extra, "stage0": env})
    record.write()
    return budget, env, record


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    budget = Budget(args.budget_s)
    imports = timed_imports(require_cuda=args.device == "cuda")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    env = stage0(args, budget, imports)
    date = datetime.datetime.now(datetime.timezone.utc)
    out = args.out or args.out_dir / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', env['device'])}_{date:%Y-%m-%d}.json"
    record = Record(out, {"schema": 1, **commit(), "device": env["device"], "date": date.isoformat(timespec="seconds"),
                          "argv": sys.argv[1:] if argv is None else list(argv), "budget_s": args.budget_s,
                          "process": {"pid": os.getpid(), "one_process": True,
                                      "note": "stages 0-3 in this process (start-up paid once); stage 3's FSDP2 "
                                              "test starts its own"},
                          "stage0": env})
    record.write()
    print(f"stage 0: {env['device']}, imports {sum(v for k, v in env['imports'].items() if k.endswith('_s')):.1f} s, "
          f"matmul {env['matmul_tflops']:.3g} TFLOP/s, writing {out}", flush=True)
    from gpu_check_stages import Check

    check = Check(args, budget, record, env)
    for number in sorted(args.stages):
        try:
            getattr(check, f"stage{number}")()
        except Exception as e:  # a stage's own failure: recorded, the next stage still runs
            record.case({"name": f"stage{number}", "stage": number, "status": "failed",
                         "reason": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]})
    record.data["elapsed_s"] = budget.elapsed()
    record.write(complete=True)
    print(f"done in {budget.elapsed():.0f} s of {args.budget_s:.0f}: ran {len(record.data['ran'])}, skipped "
          f"{len(record.data['skipped'])}, failed {len(record.data['failed'])} -> {out}", flush=True)
    return record.data


if __name__ == "__main__":
    main()
