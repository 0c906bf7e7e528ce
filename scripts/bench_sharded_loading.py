"""Peak memory of each rank while the policy loads: every rank reading the full model (what a
replicated strategy does) against FSDP2 loading (meta device, rank 0 reads, shards broadcast).

    python scripts/bench_sharded_loading.py --model smollm2-135m-instruct --out results/bench_sharded_loading.json
    python scripts/bench_sharded_loading.py --model tiny-qwen3 --nproc 2        # seconds, for tests

Each arm starts ``--nproc`` fresh processes (``torch.distributed.run``, gloo on the CPU), so a
rank's peak resident set size (``ru_maxrss``) is that arm's alone. Reported per rank: the peak
RSS before loading (Python, torch, transformers: the same in both arms), after, and the
difference, which is what loading cost; the peak after reading every weight once (the
model's safetensors are memory-mapped, so a replicated load is resident only once read, as the
first forward does); and the bytes of parameters the rank holds after
loading (its shards, or the whole model). Ratios are taken against the ``full`` arm of the
same invocation.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _worker(model: str, arm: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    import transformers  # noqa: F401 - imported before the baseline, as in both arms

    from ibpo_lit.models.loading import load_policy, load_sharded_policy
    from ibpo_lit.scale.fsdp2 import FSDP2Plan

    dist.barrier()
    before = _peak_mib()
    if arm == "full":
        policy, _ = load_policy(model)
    else:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        policy, _ = load_sharded_policy(model, FSDP2Plan(mesh=mesh))
    after = _peak_mib()
    # from_pretrained maps safetensors files lazily: a weight is resident once it is read.
    # Reading every weight once (as the first forward will) gives the resident set a trainer has.
    with torch.no_grad():
        for p in policy.parameters():
            getattr(p, "_local_tensor", p).float().sum()
    touched = _peak_mib()
    held = 0
    for p in policy.parameters():
        local = getattr(p, "_local_tensor", p)
        held += local.numel() * local.element_size()
    record = {"rank": rank, "arm": arm, "peak_before_mib": before, "peak_after_mib": after,
              "loading_mib": after - before, "peak_after_reading_mib": touched,
              "resident_cost_mib": touched - before, "params_held_mib": held / 2**20}
    Path(out_dir, f"{arm}_rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


def run_arm(model: str, arm: str, nproc: int, out_dir: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           __file__, "--worker", "--model", model, "--arm", arm, "--records", out_dir]
    subprocess.run(cmd, check=True, env=env, cwd=REPO)
    return [json.loads(Path(out_dir, f"{arm}_rank{r}.json").read_text()) for r in range(nproc)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--out", default=None, help="JSON file for the results")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--arm", choices=("full", "sharded"), help=argparse.SUPPRESS)
    parser.add_argument("--records", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.model, args.arm, args.records)
        return {}
    with tempfile.TemporaryDirectory() as records:
        arms = {arm: run_arm(args.model, arm, args.nproc, records) for arm in ("full", "sharded")}
    summary = {"model": args.model, "nproc": args.nproc, "arms": arms}
    print(f"{'arm':8} {'rank':>4} {'RSS before':>11} {'peak after load':>16} {'after reading weights':>22} "
          f"{'cost':>6} {'params held':>12}  (MiB)")
    for arm, ranks in arms.items():
        for r in ranks:
            print(f"{arm:8} {r['rank']:>4} {r['peak_before_mib']:>11.0f} {r['peak_after_mib']:>16.0f} "
                  f"{r['peak_after_reading_mib']:>22.0f} {r['resident_cost_mib']:>6.0f} {r['params_held_mib']:>12.1f}")
        total = sum(r["resident_cost_mib"] for r in ranks)
        print(f"{arm:8} all ranks: {total:.0f} MiB of resident memory for the weights")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    main()
