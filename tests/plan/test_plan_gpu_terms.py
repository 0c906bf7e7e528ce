"""The plan's GPU terms from issue 42's review (item 10), by hand on a small made-up shape: vLLM's
reserve as a function of its profiled batch, what a sleeping engine keeps, autocast's copies
(saved for backward, never cached: Lightning 2.6), the log-prob head over response positions,
AdamW's step temporary, and the memory an H100 reports."""
import inspect
from pathlib import Path

import pytest

from ibpo_lit.plan import constants, memory
from ibpo_lit.plan.cli import plan_for_config
from ibpo_lit.plan.memory import GIB
from ibpo_lit.plan.plan import DEFAULT_GPU_GIB
from ibpo_lit.plan.shapes import ModelShape
from plan_fixtures import run_shape

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

SHAPE = ModelShape(params=1000, active_params=1000, layer_params=100, embed_params=200, head_params=0,
                   largest_tensor=200, layers=8, hidden=16, mlp_width=32, q_width=16, kv_width=8, kv_heads=2,
                   head_dim=4, attention_layers=8, linear_state_elems=0, qk_norm=False, vocab=50, context=None)


def test_vllm_reserve_grows_with_the_profiled_batch():
    run = run_shape(backend="vllm", tensor_parallel=2, engine_bytes=2, max_num_seqs=4, max_num_batched_tokens=100)
    # a token: 2 bytes x (2 x 16 + (2 x 16 + 2 x 8 + 3 x 32) / 2) = 2 x (32 + 72) = 208 bytes
    # the sampler: 4 rows x 50 logits x 4 bytes x 3 copies = 2400 bytes
    assert memory.vllm_reserve(SHAPE, run) == constants.VLLM_BASE_RESERVE_GIB.value * GIB + 100 * 208 + 2400
    wider = run_shape(backend="vllm", tensor_parallel=2, engine_bytes=2, max_num_seqs=4, max_num_batched_tokens=300)
    assert memory.vllm_reserve(SHAPE, wider) - memory.vllm_reserve(SHAPE, run) == 200 * 208


def test_a_sleeping_engine_keeps_its_graph_pool_in_the_update_and_the_sync():
    resident = constants.VLLM_ASLEEP_GIB.value * GIB
    sleeping = run_shape(backend="vllm", sleep_mode=True, on_gpu=True)
    assert memory.update_memory(SHAPE, sleeping, 80 * GIB, 128)["vLLM asleep (CUDA-graph pool, NCCL buffers)"] == resident
    assert memory.sync_memory(SHAPE, sleeping)["vLLM asleep (CUDA-graph pool, NCCL buffers)"] == resident
    awake = memory.update_memory(SHAPE, run_shape(backend="vllm", on_gpu=True), 80 * GIB, 128)
    assert awake["vLLM engine (awake: no sleep mode)"] == 0.5 * 80 * GIB and not memory.asleep(run_shape(backend="vllm"))


def test_autocast_copies_are_saved_for_backward_and_never_cached():
    mixed = dict(param_bytes=4, compute_bytes=2, sharded=False)
    assert "autocast copies saved for backward" not in str(memory.rollout_memory(SHAPE, run_shape(**mixed), 0, 1, 1))
    plain = memory.update_memory(SHAPE, run_shape(**mixed), 80 * GIB, 128)
    assert plain["autocast copies saved for backward"] == 1000 * 2  # every layer's weights, 2 bytes each
    recomputed = memory.update_memory(SHAPE, run_shape(**mixed, checkpointing=True), 80 * GIB, 128)
    assert recomputed["autocast copies saved for backward"] == 100 * 2  # the recomputed layer's
    sharded = memory.update_memory(SHAPE, run_shape(param_bytes=4, compute_bytes=2, sharded=True, processes=2), 0, 128)
    assert "autocast copies saved for backward" not in sharded  # FSDP2 gathers bf16 units instead


def test_lightnings_amp_plugin_caches_no_weight_copies():
    """What the autocast term rests on: if Lightning starts caching, the plan must count a copy."""
    from lightning.pytorch.plugins.precision.amp import MixedPrecision

    assert "cache_enabled=False" in inspect.getsource(MixedPrecision.autocast_context_manager)


def test_the_log_prob_head_sees_response_positions_only():
    run = run_shape(micro_batch_size=2, max_prompt_tokens=64, max_new_tokens=16)
    head = memory.update_memory(SHAPE, run, 0, 80)["log-prob head chunk"]
    assert head == 2 * 16 * 50 * 10  # 2 rows x 16 response positions x 50 logits x 10 bytes
    chunked = memory.update_memory(SHAPE, run_shape(micro_batch_size=2, max_new_tokens=16, logprob_chunk_tokens=20), 0, 80)
    assert chunked["log-prob head chunk"] == 20 * 50 * 10
    corrections = run_shape(micro_batch_size=2, max_new_tokens=16, corrections=True, correction_new_tokens=40)
    assert memory.update_memory(SHAPE, corrections, 0, 200)["log-prob head chunk"] == 2 * 40 * 50 * 10


@pytest.mark.parametrize("micro_batch_size", [1, 64])
def test_the_update_peak_is_state_plus_the_larger_moment(micro_batch_size):
    run = run_shape(processes=2, sharded=True, adamw_kernel="foreach", micro_batch_size=micro_batch_size)
    state, backward, step = memory.update_moments(SHAPE, run, 128)
    assert step == 1000 * 4 / 2  # foreach AdamW: one float32 copy of the shard
    parts = memory.update_memory(SHAPE, run, 0, 128)
    assert sum(parts.values()) == pytest.approx(sum(state.values()) + max(sum(backward.values()), step))
    assert ("AdamW step temporary beyond backward" in parts) == (step > sum(backward.values()))
    fused = memory.update_moments(SHAPE, run_shape(adamw_kernel="fused"), 128)[2]
    single = memory.update_moments(SHAPE, run_shape(adamw_kernel="single"), 128)[2]
    assert fused == 0 and single == 200 * 4  # the per-tensor loop: the largest tensor's


def test_the_shipped_configs_read_their_profile_batch_and_optimizer_kernel():
    plan = plan_for_config(["--config", str(CONFIGS / "qwen3_32b.yaml")])
    assert plan.run.max_num_batched_tokens == 4096 and plan.run.adamw_kernel == "foreach"
    wide = plan_for_config(["--config", str(CONFIGS / "qwen3_32b.yaml"),
                            "--model.rollout.vllm.max_num_batched_tokens", "16384"])
    assert wide.run.max_num_batched_tokens == 16384
    assert memory.vllm_reserve(wide.model, wide.run) > memory.vllm_reserve(plan.model, plan.run)


def test_without_a_gpu_the_plan_is_for_the_memory_an_h100_reports():
    assert DEFAULT_GPU_GIB == constants.H100_MEMORY_GIB.value == 79.2
    assert "vLLM asleep 1.5 GiB" in constants.unmeasured()
