"""Run by tests/rewards/test_untrusted_verdicts.py on 2 processes (torchrun, gloo):

1. a `Deadline` of 10 s checked before each of 6 units of collective work, whose clock on rank 1
   advances 6 s a unit (past the limit after unit 2) while rank 0's stands still;
2. the reward model of ``OUT_DIR/model`` sharded with FSDP2, rank 1's time limit passed at once
   (1 ns), rank 0's not (600 s): every forward is a collective, so both must stop before the first.

Writes ``OUT_DIR/rank<r>.json``."""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ibpo_lit.model_rewards import ModelRewardContext, RewardModel, RewardModelOptions
from ibpo_lit.scale.collectives import RankSync
from ibpo_lit.scale.deadline import Deadline
from ibpo_lit.scale.fsdp2 import FSDP2Plan

PROBLEMS = ["What is 2+3?", "Add 1 and 1.", "Is 7 prime?", "x", "Compute 12*3, then add 4."]
RESPONSES = ["5", "The sum is 2 #### 2", "yes", "a longer response", "40"]


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = RankSync(world, "cpu")

    now = [0.0]
    deadline = Deadline("test phase", 10.0, sync, version=4, clock=lambda: now[0])
    stopped_at = None
    for unit in range(6):
        if deadline.passed():
            stopped_at = unit
            break
        if rank == 1:
            now[0] += 6.0
        sync.sum([1.0])  # the unit's own collective

    mesh = init_device_mesh("cpu", (world,))
    ctx = ModelRewardContext(sync=sync, plan=FSDP2Plan(mesh=mesh), weights_version=lambda: 4)
    limit = 1e-9 if rank == 1 else 600.0
    rm = RewardModel((Path(out_dir) / "model").read_text(), ctx, RewardModelOptions(batch_size=2, time_limit_s=limit))
    problems, responses = (PROBLEMS, RESPONSES) if rank == 0 else (PROBLEMS[:1], RESPONSES[:1])
    scores = rm(problems, responses)
    with open(Path(out_dir) / f"rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "stopped_at": stopped_at, "message": deadline.message(), "scores": scores,
                   "texts": len(problems), "timed_out": rm.last_report.timed_out,
                   "rm_message": rm.last_report.timeout_message}, f)
    from rank_exit import end_processes  # tests/scale, on the workers' path

    end_processes()


if __name__ == "__main__":
    main(sys.argv[1])
