"""``FSDP2Strategy``: Lightning's ``ModelParallelStrategy`` set up for sharded RL training.

Swap it in with one config line, ``trainer.strategy: fsdp2`` (registered under that name in
Lightning's strategy registry; with settings, ``class_path: ibpo_lit.scale.FSDP2Strategy``);
the module shards its policy with it in ``configure_model``. What it adds to Lightning's strategy:

    * every process is one data-parallel rank (``data_parallel_size`` = world size, no tensor
      parallelism of the trained model), so the mesh needs no sizes from the user;
    * ``trainer.precision: bf16-mixed`` becomes FSDP2's mixed precision (bf16 compute, fp32
      gradient reduction, fp32 master weights and optimizer state) instead of autocast, which
      would leave the all-gathers and reduce-scatters in fp32;
    * the shard plan's settings (`plan`), read by the module when it builds the policy;
    * atomic sharded checkpoints: a checkpoint directory is written beside its target under a
      hidden name, and ``last.ckpt`` becomes a symbolic link to it, replaced with one atomic
      rename. A run killed at any point of a save keeps the previous checkpoint whole; the
      next save removes what a killed save left behind.

Why not Lightning's ``FSDPStrategy`` (FSDP1): it wraps the whole LightningModule and runs
``training_step`` inside the root's forward, where the module's manual backward passes trip
FSDP1's post-backward checks, and callbacks cannot forward the policy outside it. FSDP2
shards modules in place, so every forward (rollouts, corrections, CIW, the weight-sync probe)
is an ordinary call.

Not covered: tensor or pipeline parallelism of the trained model; HSDP (replicate across
nodes, shard within); checkpoint folders on object stores (paths must be a shared POSIX file
system, see docs/scaling.md).
"""
from __future__ import annotations

import os
import shutil
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry

from ibpo_lit.scale.fsdp2 import FSDP2Plan
from ibpo_lit.fsync import fsync_dir

_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


CPU_OFFLOAD_UNSUPPORTED = (
    "trainer.strategy.init_args.cpu_offload: not supported yet (the vLLM weight sync and the checkpoint gather "
    "full tensors from the shards over the GPUs' collective, which CPU-offloaded shards cannot join); leave it "
    "false and lower the memory another way (more processes, gradient checkpointing, model.logprob_chunk_tokens)"
)


class FSDP2Strategy(ModelParallelStrategy):
    """Fully sharded data parallelism (FSDP2) over every process of the run.

    Args:
        reshard_after_forward: Free each decoder layer's gathered weights after its forward and
            gather them again in backward (less memory); false keeps them until backward.
        cpu_offload: Keep parameter shards, gradients and optimizer state in CPU memory. Not
            supported yet (refused): the weight sync gathers full tensors from the shards with a
            collective of the accelerator's backend, which CPU-resident shards cannot join
            (TRL and verl move each shard to the GPU first); no GPU run has tested it.
        save_distributed_checkpoint: Each rank writes its own shard (a checkpoint folder);
            false gathers the full model and optimizer on rank 0 into one file.
        process_group_backend: ``nccl`` / ``gloo``; unset = the device's default.
        timeout: How long a collective waits for the other ranks.
    """

    strategy_name = "fsdp2"

    def __init__(
        self,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        save_distributed_checkpoint: bool = True,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = default_pg_timeout,
    ) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        if cpu_offload:
            raise ValueError(CPU_OFFLOAD_UNSUPPORTED)
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = cpu_offload
        self.param_dtype: Optional[torch.dtype] = None

    # -------------------------------------------------------------- precision
    @property
    def precision_plugin(self) -> Precision:
        return self._precision_plugin if self._precision_plugin is not None else Precision()

    @precision_plugin.setter
    def precision_plugin(self, plugin: Optional[Precision]) -> None:
        # bf16-mixed: FSDP2's MixedPrecisionPolicy casts the gathered parameters; no autocast.
        if isinstance(plugin, MixedPrecision):
            self.param_dtype = _DTYPES[plugin.precision]
            plugin = Precision()
        elif isinstance(plugin, HalfPrecision):
            self.param_dtype = None  # the module itself is cast (bf16-true): nothing to add
        self._precision_plugin = plugin

    # ------------------------------------------------------------------ mesh
    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    @property
    def plan(self) -> FSDP2Plan:
        """How the module shards its models (after the processes are set up)."""
        return FSDP2Plan(
            mesh=self.device_mesh["data_parallel"],
            param_dtype=self.param_dtype,
            reduce_dtype=torch.float32,
            reshard_after_forward=self.reshard_after_forward,
            cpu_offload=self.cpu_offload,
        )

    # ----------------------------------------------------------- checkpoints
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Optional[Any] = None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        target = Path(self.broadcast(str(filepath)))
        folder = target.parent / f".{target.name}.{self.broadcast(uuid.uuid4().hex[:12])}"
        if self.is_global_zero:
            target.parent.mkdir(parents=True, exist_ok=True)
            _remove_orphans(target)
        self.barrier()
        super().save_checkpoint(checkpoint, folder, storage_options)
        self.barrier()
        if self.is_global_zero:
            _publish(folder, target)
        self.barrier()

    def remove_checkpoint(self, filepath) -> None:
        if self.is_global_zero:
            path = Path(filepath)
            if path.is_symlink():
                linked = path.parent / os.readlink(path)
                path.unlink()
                shutil.rmtree(linked, ignore_errors=True)
            elif path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()


if FSDP2Strategy.strategy_name not in StrategyRegistry:
    StrategyRegistry.register(
        FSDP2Strategy.strategy_name, FSDP2Strategy, description="ibpo-lit: FSDP2 over every process (data parallel)"
    )


def _publish(folder: Path, target: Path) -> None:
    """Point ``target`` at ``folder`` atomically and remove what it pointed at before."""
    previous = target.parent / os.readlink(target) if target.is_symlink() else None
    link = target.parent / f".{target.name}.link-{uuid.uuid4().hex[:8]}"
    os.symlink(folder.name, link)  # relative: the run folder may be moved or mounted elsewhere
    if target.exists() and not target.is_symlink():
        # A plain file or folder from a non-atomic save: replaced by the link (a rename cannot
        # put a link over a non-empty folder, so move it aside first).
        aside = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(target, aside)
        previous = aside
    os.replace(link, target)
    fsync_dir(str(target.parent))
    if previous is not None and previous.resolve() != folder.resolve():
        if previous.is_dir():
            shutil.rmtree(previous, ignore_errors=True)
        elif previous.exists():
            previous.unlink()


def _remove_orphans(target: Path) -> None:
    """Folders and links a killed save of ``target`` left beside it (not the live one)."""
    live = (target.parent / os.readlink(target)).resolve() if target.is_symlink() else None
    for path in target.parent.glob(f".{target.name}.*"):
        if live is not None and path.resolve() == live:
            continue
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)



def sharding_plan(strategy: Any) -> Optional[FSDP2Plan]:
    """How a module shards its models under ``strategy``: `FSDP2Strategy`'s plan, FSDP2 with
    default settings under Lightning's ``ModelParallelStrategy`` (data parallel only), None
    for strategies that replicate the model (single device, DDP)."""
    if isinstance(strategy, FSDP2Strategy):
        return strategy.plan
    if isinstance(strategy, ModelParallelStrategy):
        mesh = strategy.device_mesh
        if mesh["tensor_parallel"].size() > 1:
            raise ValueError(
                "trainer.strategy: ModelParallelStrategy with tensor_parallel_size > 1 is not supported "
                "(ibpo-lit shards the policy over data-parallel ranks only); use ibpo_lit.scale.FSDP2Strategy"
            )
        return FSDP2Plan(mesh=mesh["data_parallel"])
    return None
