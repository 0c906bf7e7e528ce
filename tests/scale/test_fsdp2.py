"""The pieces of the scale path: FSDP2 loading, weight iteration, gathered generation and log-probs
on 2 processes (tests/scale/fsdp2_checks.py), and, in one process, the checkpoint publishing,
the rank-agreement object and the config checks."""
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fit_runs import HERE, REPO, two_process_results
from ibpo_lit.config_checks import context_fits, strategy_supported, tensor_parallel_fits
from ibpo_lit.scale.collectives import SINGLE_PROCESS
from ibpo_lit.scale.strategy import _publish, _remove_orphans


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    return two_process_results(HERE / "fsdp2_checks.py", tmp_path_factory.mktemp("fsdp2_checks"))


@pytest.mark.slow
def test_sharded_loading_gives_the_reference_weights(checks):
    for rank in checks:
        for dtype in ("float32", "bfloat16"):
            assert rank[f"load_{dtype}_max_diff"] == 0.0
            assert rank[f"load_{dtype}_tied"]
            # rotary inv_freq recomputed in fp32 even for a bf16 model
            assert rank[f"load_{dtype}_inv_freq"] == ["torch.float32", 0.0]
            # each rank holds about half the parameters (shards), not a full copy
            assert rank[f"load_{dtype}_local_numel"] <= 0.6 * rank[f"load_{dtype}_full_numel"]
            # the compute budget's N is the whole model's on every rank
            assert rank[f"load_{dtype}_numel_seen"] == rank[f"load_{dtype}_full_numel"]
        assert rank["load_eager_attention"] == "eager"  # model.attn_implementation, set before sharding


@pytest.mark.slow
def test_weight_iteration_over_shards_sends_every_tensor_whole(checks):
    for rank in checks:
        assert rank["weights_names_equal"] and rank["weights_max_diff"] == 0.0
        assert rank["weights_missing"] == []


def test_a_sync_to_a_bf16_engine_gathers_bf16(checks):
    """The weight sync casts each shard to the engine's dtype before gathering (issue 42, review
    item 7: it gathered the fp32 master weights, then cast): half the bytes, the same values."""
    for rank in checks:
        fp32_bytes, bf16_bytes = rank["sync_gathered_bytes"]
        assert fp32_bytes > 0 and bf16_bytes * 2 == fp32_bytes
        assert rank["sync_bf16_dtypes"] == ["torch.bfloat16"] and rank["sync_bf16_is_cast_after_gather"]


@pytest.mark.slow
def test_generation_with_gathered_weights_on_unequal_ranks(checks):
    for rank in checks:
        assert rank["generate_same_tokens"] and rank["sharded_after_generate"]
        assert rank["gathered_is_plain"] and rank["empty_generate_rows"] == 0


@pytest.mark.slow
def test_sharded_logprobs_and_gradients_match_the_reference(checks):
    for rank in checks:
        assert rank["logp_max_diff"] < 1e-5
        assert rank["grad_max_diff"] < 1e-5
        assert rank["grad_norm"] == pytest.approx(rank["grad_norm_reference"], rel=1e-5)
    assert checks[0]["grad_norm"] == checks[1]["grad_norm"]  # a global norm, the same on every rank


@pytest.mark.slow
def test_gradient_checkpointing_under_fsdp2_gives_the_same_gradient(checks):
    for rank in checks:
        assert rank["checkpointed_grad_max_diff"] < 1e-5


def test_rank_variables_are_exported_whatever_launched_the_run(monkeypatch):
    """Lightning's launcher and srun leave RANK unset; vLLM's external launcher reads it."""
    from ibpo_lit.scale.launch_env import export_rank_env

    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        # setenv first so that monkeypatch records the key and removes what export_rank_env
        # writes: delenv of an absent key records nothing, and a leaked RANK=5 makes every
        # later Lightning run in this pytest process think it is rank 5 of 8.
        monkeypatch.setenv(key, "unset")
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_PROCID", "5")
    cluster = SimpleNamespace(main_address="node-0", main_port=29511)
    trainer = SimpleNamespace(global_rank=5, local_rank=1, world_size=8,
                              strategy=SimpleNamespace(num_processes=4, cluster_environment=cluster))
    export_rank_env(trainer)
    assert [os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")] == [
        "5", "1", "8", "4", "node-0", "29511"]


# ----------------------------------------------------------------- one process
def test_publish_replaces_the_link_atomically_and_cleans_up(tmp_path):
    target = tmp_path / "last.ckpt"
    first, second = tmp_path / ".last.ckpt.a", tmp_path / ".last.ckpt.b"
    for folder in (first, second):
        folder.mkdir()
        (folder / "meta.pt").write_text(folder.name)
    _publish(first, target)
    assert target.is_symlink() and (target / "meta.pt").read_text() == ".last.ckpt.a"
    _publish(second, target)
    assert (target / "meta.pt").read_text() == ".last.ckpt.b" and not first.exists()
    assert os.readlink(target) == ".last.ckpt.b"  # relative: the run folder can move


def test_publish_over_a_plain_file_or_folder(tmp_path):
    target = tmp_path / "last.ckpt"
    target.write_text("an old single-file checkpoint")
    folder = tmp_path / ".last.ckpt.x"
    folder.mkdir()
    _publish(folder, target)
    assert target.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == [".last.ckpt.x", "last.ckpt"]


def test_orphans_of_a_killed_save_are_removed_and_the_live_folder_kept(tmp_path):
    target = tmp_path / "last.ckpt"
    live, orphan = tmp_path / ".last.ckpt.live", tmp_path / ".last.ckpt.killed"
    live.mkdir()
    orphan.mkdir()
    (tmp_path / ".last.ckpt.link-1234").symlink_to(orphan.name)
    _publish(live, target)
    _remove_orphans(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".last.ckpt.live", "last.ckpt"]


def test_a_single_process_agrees_with_itself():
    assert SINGLE_PROCESS.max(3) == 3 and SINGLE_PROCESS.sum([1.0, 2.0]) == [1.0, 2.0]
    assert SINGLE_PROCESS.any(False) is False and SINGLE_PROCESS.gather("x") == ["x"]
    assert SINGLE_PROCESS.reduce_metrics({"a": 1.0}, lambda key: "sum") == {"a": 1.0}


def test_fsdp1_and_deepspeed_are_refused_with_the_replacement():
    fsdp1 = type("FSDPStrategy", (), {})()
    assert "ibpo_lit.scale.FSDP2Strategy" in strategy_supported(fsdp1)
    assert "not supported" in strategy_supported(type("DeepSpeedStrategy", (), {})())
    assert strategy_supported(SimpleNamespace()) is None


def test_vllm_tensor_parallel_must_divide_the_processes():
    assert tensor_parallel_fits("vllm", 2, 4) is None and tensor_parallel_fits("hf", 3, 4) is None
    assert "does not divide the 4 processes" in tensor_parallel_fits("vllm", 3, 4)


def test_context_is_checked_against_the_model_and_the_engine():
    assert context_fits("tiny-qwen3", 256, 512, None) is None
    assert "context of 8192" in context_fits("tiny-qwen3", 4096, 8192, None)
    assert "max_model_len=512" in context_fits("tiny-qwen3", 256, 512, 512)
    assert context_fits("some-org/not-cached-model", 10**6, 10**6, None) is None  # unknown offline: no claim


def test_directory_checkpoints_are_accepted_only_when_sharded(tmp_path):
    from ibpo_lit.config_checks import checkpoint_readable

    plain = tmp_path / "plain"
    plain.mkdir()
    assert "not a sharded checkpoint" in checkpoint_readable(str(plain))
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / ".metadata").write_bytes(b"")
    (sharded / "meta.pt").write_bytes(b"")
    assert checkpoint_readable(str(sharded)) is None


def test_rotary_buffers_come_back_in_float32():
    from ibpo_lit.models.loading import build_builtin_model
    from ibpo_lit.scale.fsdp2 import fp32_rotary_buffers

    reference = build_builtin_model("tiny-llama").model.rotary_emb.inv_freq
    model = build_builtin_model("tiny-llama").to(torch.bfloat16)
    assert model.model.rotary_emb.inv_freq.dtype == torch.bfloat16  # what a cast does
    fp32_rotary_buffers(model)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(model.model.rotary_emb.inv_freq, reference)
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16  # weights untouched
    assert Path(REPO / "configs" / "tiny_fsdp.yaml").is_file()
