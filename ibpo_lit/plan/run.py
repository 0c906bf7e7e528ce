"""What a run's config asks of each GPU, gathered once from the built config objects.

`RunShape.from_fit` reads the instantiated ``IBPOModule``, ``PromptDataModule`` and the
trainer's settings (a Lightning ``Trainer`` or, for ``python -m ibpo_lit plan``, the config's
``trainer`` section as a namespace): nothing is loaded. Every number the plan uses from the
config is here, under the name the plan's arithmetic uses; each comes from its one home in the
config (the key is in the comment).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_TIMEOUT_S = 1800.0  # torch.distributed's (and Lightning's) default collective timeout
VLLM_DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default when rollout.vllm.max_num_seqs is unset
VLLM_PROFILE_TOKENS = 4096
"""The profiler's batch when the config does not say (a VLLMConfig without
``max_num_batched_tokens``, or a CPU run where vLLM's own default applies): the engine's pin on a
GPU, as TRL's."""


@dataclass(frozen=True)
class RunShape:
    processes: int  # trainer.devices x trainer.num_nodes
    sharded: bool  # trainer.strategy is FSDP2: parameters, gradients, optimizer state sharded
    param_bytes: int  # model.dtype: master weights, gradients, AdamW's two moments
    compute_bytes: int  # trainer.precision: bf16-* computes in 2 bytes
    backend: str  # model.rollout.backend
    tensor_parallel: int  # model.rollout.vllm.tensor_parallel_size
    gpu_memory_utilization: float  # model.rollout.vllm.gpu_memory_utilization
    sleep_mode: bool  # model.rollout.vllm.enable_sleep_mode
    engine_bytes: int  # model.rollout.vllm.dtype
    max_num_seqs: int  # model.rollout.vllm.max_num_seqs
    max_num_batched_tokens: int  # model.rollout.vllm.max_num_batched_tokens: vLLM's profiled batch
    max_model_len: Optional[int]  # model.rollout.vllm.max_model_len (vLLM only)
    group_size: int  # model.rollout.group_size
    prompts_per_rank: int  # data.prompts_per_step
    max_prompt_tokens: int  # data.max_prompt_tokens
    max_new_tokens: int  # model.rollout.sampling.max_new_tokens
    micro_batch_size: int  # model.rollout.micro_batch_size
    extra_old_logp_forward: bool  # model.rollout.old_logp trainer with num_mini_batches > 1
    checkpointing: bool  # model.gradient_checkpointing
    logprob_chunk_tokens: Optional[int]  # model.logprob_chunk_tokens
    adamw_kernel: str  # model.optim.fused: "fused", "foreach" (GPU) or "single" (the per-tensor loop)
    corrections: bool  # model.algorithm.ibpo.variant != none
    correction_new_tokens: int  # model.algorithm.ibpo.max_new_tokens (unset: the rollouts')
    corrections_per_input: int  # model.algorithm.ibpo.corrections_per_input
    two_candidates: bool  # model.algorithm.ibpo.reference != none
    train_on_corrections: bool  # model.algorithm.ibpo.train_on_corrections
    timeout_s: float  # trainer.strategy's timeout
    on_gpu: bool  # trainer.accelerator
    micro_batch_tokens: Optional[int] = None  # model.rollout.micro_batch_tokens
    packing: str = "off"  # model.rollout.packing

    def micro_batch_rows(self, row_tokens: int) -> int:
        """Rows of ``row_tokens`` tokens in one micro-batch: ``micro_batch_size``, fewer under a
        token budget (counted padded), and one for a row over it (it runs alone)."""
        if self.micro_batch_tokens is None:
            return self.micro_batch_size
        return max(1, min(self.micro_batch_size, self.micro_batch_tokens // max(row_tokens, 1)))

    def packed_tokens(self, longest_row: int) -> int:
        """The longest packed micro-batch (``rollout.packing``): ``micro_batch_size`` rows of
        ``longest_row`` tokens, or, under a budget of real tokens, the budget (shorter rows fill
        it), and the longest row where it is over the budget (it runs alone)."""
        rows = self.micro_batch_size * longest_row
        budget = self.micro_batch_tokens if self.micro_batch_tokens is not None else rows
        return max(longest_row, min(budget, rows))

    @classmethod
    def from_fit(cls, module: Any, datamodule: Any, trainer: Any) -> "RunShape":
        rollout, ibpo = module.rollout_cfg, module.algorithm.ibpo
        strategy = getattr(trainer, "strategy", None)
        precision = str(getattr(trainer, "precision", None) or "32")
        param_bytes = DTYPE_BYTES.get(module.dtype_name, 4)
        engine_dtype = rollout.vllm.dtype
        timeout = getattr(strategy, "_timeout", None) or getattr(strategy, "timeout", None)
        on_gpu = str(getattr(trainer, "accelerator", "")).lower() in ("gpu", "cuda") or \
            type(getattr(trainer, "accelerator", None)).__name__ == "CUDAAccelerator"
        sharded = type(strategy).__name__ == "FSDP2Strategy" or strategy == "fsdp2"
        return cls(
            processes=_processes(trainer),
            sharded=sharded,
            param_bytes=param_bytes,
            compute_bytes=2 if precision.startswith(("bf16", "16")) else param_bytes,
            backend=rollout.backend,
            tensor_parallel=rollout.vllm.tensor_parallel_size if rollout.backend == "vllm" else 1,
            gpu_memory_utilization=rollout.vllm.gpu_memory_utilization,
            sleep_mode=rollout.vllm.enable_sleep_mode,
            engine_bytes=param_bytes if engine_dtype == "auto" else DTYPE_BYTES[engine_dtype],
            max_num_seqs=rollout.vllm.max_num_seqs or VLLM_DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens=_profile_tokens(rollout.vllm, on_gpu),
            max_model_len=rollout.vllm.max_model_len if rollout.backend == "vllm" else None,
            group_size=rollout.group_size,
            prompts_per_rank=getattr(datamodule, "prompts_per_step", 1),
            max_prompt_tokens=getattr(datamodule, "max_prompt_tokens", 0) or 0,
            max_new_tokens=rollout.sampling.max_new_tokens,
            micro_batch_size=rollout.micro_batch_size,
            micro_batch_tokens=rollout.micro_batch_tokens,
            packing=getattr(rollout, "packing", "off"),
            extra_old_logp_forward=rollout.old_logp == "trainer" and rollout.num_mini_batches > 1,
            checkpointing=bool(module.gradient_checkpointing),
            logprob_chunk_tokens=module.logprob_chunk_tokens,
            adamw_kernel=_adamw_kernel(getattr(module.optim_cfg, "fused", None), sharded, on_gpu),
            corrections=ibpo.variant != "none",
            correction_new_tokens=ibpo.max_new_tokens or rollout.sampling.max_new_tokens,
            corrections_per_input=ibpo.corrections_per_input,
            two_candidates=getattr(ibpo, "reference", "correct") != "none",
            train_on_corrections=bool(ibpo.train_on_corrections),
            timeout_s=timeout.total_seconds() if isinstance(timeout, timedelta) else DEFAULT_TIMEOUT_S,
            on_gpu=on_gpu,
        )

    @property
    def shard_degree(self) -> int:
        return self.processes if self.sharded else 1

    def context_limit(self, model_context: Optional[int]) -> Optional[int]:
        """Longest prompt + response the policy and the engine take (as ``IBPOModule.context_limit``)."""
        limits = [x for x in (model_context, self.max_model_len) if x]
        return min(limits) if limits else None


def _processes(trainer: Any) -> int:
    devices = getattr(trainer, "num_devices", None) or getattr(trainer, "devices", 1)
    try:
        devices = int(devices)
    except (TypeError, ValueError):
        devices = 1
    return max(1, devices) * max(1, int(getattr(trainer, "num_nodes", 1) or 1))


def _profile_tokens(vllm: Any, on_gpu: bool) -> int:
    """The batch vLLM profiles its reserve with: ``VLLMConfig.batched_tokens`` where the config
    has it, else `VLLM_PROFILE_TOKENS`."""
    batched = getattr(vllm, "batched_tokens", None)
    return (batched(on_gpu) if callable(batched) else None) or VLLM_PROFILE_TOKENS


def _adamw_kernel(fused: Optional[bool], sharded: bool, on_gpu: bool) -> str:
    """Which AdamW kernel steps (as `ibpo_lit.training.optimizer.use_fused_adamw` decides: fused
    unless asked otherwise wherever the parameters are plain tensors, not FSDP2's DTensors);
    otherwise torch's foreach kernel on a GPU and its per-tensor loop on the CPU."""
    use_fused = fused if fused is not None else not sharded
    if use_fused:
        return "fused"
    return "foreach" if on_gpu else "single"
