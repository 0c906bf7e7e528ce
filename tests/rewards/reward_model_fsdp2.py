"""Run by tests/rewards/test_reward_model.py on 2 processes (torchrun, gloo): the reward model of
``OUT_DIR/model`` loaded sharded with FSDP2, each rank scoring a different number of texts
(rank 0: 5 in 3 batches; rank 1: 1 in 1 batch, then none while rank 0 scores 3). Writes
``OUT_DIR/rank<r>.json``."""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ibpo_lit.model_rewards import ModelRewardContext, RewardModel, RewardModelOptions
from ibpo_lit.scale.collectives import RankSync
from ibpo_lit.scale.fsdp2 import FSDP2Plan

PROBLEMS = ["What is 2+3?", "Add 1 and 1.", "Is 7 prime?", "x", "Compute 12*3, then add 4."]
RESPONSES = ["5", "The sum is 2 #### 2", "yes", "a much longer response than the others, " * 3, "40"]


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    folder = (Path(out_dir) / "model").read_text()
    ctx = ModelRewardContext(sync=RankSync(world, "cpu"), plan=FSDP2Plan(mesh=mesh))
    rm = RewardModel(folder, ctx, RewardModelOptions(batch_size=2))
    problems, responses = (PROBLEMS, RESPONSES) if rank == 0 else (PROBLEMS[1:2], RESPONSES[1:2])
    scores = rm(problems, responses)
    empty = rm(PROBLEMS[:3], RESPONSES[:3]) if rank == 0 else rm([], [])
    local = sum(p._local_tensor.numel() for p in rm.model.parameters() if hasattr(p, "_local_tensor"))
    full = sum(p.numel() for p in rm.model.parameters())
    still_sharded = all(hasattr(p, "_local_tensor") for p in rm.model.parameters())
    with open(Path(out_dir) / f"rank{rank}.json", "w") as f:
        json.dump({"problems": problems, "responses": responses, "scores": scores, "empty": empty,
                   "local_numel": local, "full_numel": full, "still_sharded": still_sharded}, f)
    from rank_exit import end_processes  # tests/scale, on the workers' path

    end_processes()


if __name__ == "__main__":
    main(sys.argv[1])
