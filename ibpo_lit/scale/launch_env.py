"""The rank variables libraries read from the environment, set from the run's own ranks.

vLLM's ``external_launcher`` executor (one vLLM worker inside each trainer process) reads
``RANK`` and ``LOCAL_RANK`` from the environment, as torchrun sets them. Lightning's own
launcher (``python -m ibpo_lit fit`` with ``trainer.devices: 2``) and SLURM (``srun``) start
processes without them (SLURM says ``SLURM_PROCID``), so whatever launched the run, the
values Lightning settled on are exported here before such a library starts.
"""
from __future__ import annotations

import os
from typing import Any


def export_rank_env(trainer: Any) -> dict[str, str]:
    """Set ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` from a Lightning ``Trainer``; returns what was set."""
    strategy = trainer.strategy
    values = {
        "RANK": trainer.global_rank,
        "LOCAL_RANK": trainer.local_rank,
        "WORLD_SIZE": trainer.world_size,
        "LOCAL_WORLD_SIZE": getattr(strategy, "num_processes", 1) or 1,
    }
    cluster = getattr(strategy, "cluster_environment", None)
    if cluster is not None:
        values["MASTER_ADDR"] = cluster.main_address
        values["MASTER_PORT"] = cluster.main_port
    exported = {key: str(value) for key, value in values.items()}
    os.environ.update(exported)
    return exported
