"""Run by tests/rollout/test_vllm_server.py on 2 processes (torchrun, gloo): how `VLLMServerEngine`
waits on its requests when the ranks' servers behave differently. No server: each rank's
"requests" are futures the script settles itself, so what is tested is the agreement alone.

1. stalled: rank 0's request never answers, rank 1's answered at once; a 3 s deadline. Both ranks
   must raise `EngineUnavailable` together (rank 1 alone would otherwise wait in the next
   collective for ever), at about the deadline.
2. failed: rank 1's request fails (a dead server), rank 0's never answers; no deadline reached
   (600 s): both ranks raise at once, each naming rank 1's error.
3. answered: both answer: both return their own results.

Writes ``OUT_DIR/rank<r>.json``."""
import json
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist

from ibpo_lit.rollout.vllm_server import EngineUnavailable, VLLMServerEngine
from ibpo_lit.scale.collectives import RankSync
from ibpo_lit.scale.deadline import Deadline


def _engine(sync: RankSync) -> VLLMServerEngine:
    engine = object.__new__(VLLMServerEngine)  # only what `_wait` and its message read
    engine.sync, engine.url, engine.workers = sync, "http://server-of-this-test", "worker process(es) pid 1 on here"
    engine.weights_version, engine.incoming_weights_version = 5, 6
    return engine


def _settled(value=None, error=None) -> Future:
    future: Future = Future()
    future.set_running_or_notify_cancel()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
    return future


def _pending() -> Future:
    future: Future = Future()
    future.set_running_or_notify_cancel()  # running: it cannot be cancelled, as a request in flight
    return future


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sync = RankSync(dist.get_world_size(), "cpu")
    engine = _engine(sync)
    out = {"rank": rank}

    start = time.monotonic()
    futures = [_pending()] if rank == 0 else [_settled("row")]
    try:
        engine._wait(futures, Deadline("generate", 3.0, sync, 5), "generate")
    except EngineUnavailable as err:
        out["stalled"] = str(err)
    out["stalled_s"] = time.monotonic() - start

    start = time.monotonic()
    futures = [_pending()] if rank == 0 else [_settled(error=ConnectionError("connection refused"))]
    try:
        engine._wait(futures, Deadline("sync", 600.0, sync, 6), "sync")
    except EngineUnavailable as err:
        out["failed"] = str(err)
    out["failed_s"] = time.monotonic() - start

    out["answered"] = engine._wait([_settled(f"row of rank {rank}")], Deadline("generate", 600.0, sync, 5), "generate")
    with open(Path(out_dir) / f"rank{rank}.json", "w") as f:
        json.dump(out, f)
    from rank_exit import end_processes  # tests/scale, on the workers' path

    end_processes()


if __name__ == "__main__":
    main(sys.argv[1])
