"""A `RunShape` with plain values, any of them replaced (tests only)."""
from dataclasses import replace

from ibpo_lit.plan.run import RunShape

BASE = RunShape(
    processes=1, sharded=False, param_bytes=4, compute_bytes=4, backend="hf", tensor_parallel=1,
    gpu_memory_utilization=0.5, sleep_mode=False, engine_bytes=4, max_num_seqs=256, max_num_batched_tokens=4096,
    max_model_len=None,
    group_size=4, prompts_per_rank=2, max_prompt_tokens=64, max_new_tokens=64, micro_batch_size=2,
    extra_old_logp_forward=False, checkpointing=False, logprob_chunk_tokens=None, adamw_kernel="fused", corrections=False,
    correction_new_tokens=64, corrections_per_input=1, two_candidates=True, train_on_corrections=True,
    timeout_s=1800.0, on_gpu=False,
)


def run_shape(**changes) -> RunShape:
    return replace(BASE, **changes)
