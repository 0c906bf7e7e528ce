"""The sharded training state one rank holds after a real step, measured on 2 processes, run by
tests/plan/test_plan_measured.py as ``python -m torch.distributed.run --nproc_per_node 2
plan_state_check.py OUT_DIR``; each rank writes ``OUT_DIR/rank<r>.json``."""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ibpo_lit.models.loading import load_sharded_policy
from ibpo_lit.scale.fsdp2 import FSDP2Plan


def local_bytes(t) -> int:
    t = getattr(t, "_local_tensor", t)
    return t.numel() * t.element_size()


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, _ = load_sharded_policy("tiny-qwen3", FSDP2Plan(mesh=mesh), seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    params = list(model.parameters())
    out = {
        "parameters": sum(local_bytes(p) for p in params),
        "gradients": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(local_bytes(v) for state in optimizer.state.values() for k, v in state.items()
                         if torch.is_tensor(v) and k != "step"),
    }
    Path(out_dir, f"rank{dist.get_rank()}.json").write_text(json.dumps(out))
    from rank_exit import end_processes  # tests/scale, on the workers' path

    end_processes()


if __name__ == "__main__":
    main(sys.argv[1])
