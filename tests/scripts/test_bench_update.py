"""scripts/bench_update.py on the CPU with the tiny shape (the GPU machine runs the same code on
Qwen3-1.7B at 8k-token rows): variants of the same rows train the same work (equal gradient
norms), the baseline's speed-up is 1 by construction and the others' are beside it, a profiled
run records its time by family, and a variant that fails is recorded while the next still runs."""
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["--device", "cpu", "--shape", "tiny", "--row-tokens", "64", "--prompt-tokens", "16", "--rows", "4", "--budget-s", "1e9",
        "--steps", "1"]  # the budget counts from the process's start: a pytest session's, long before


@pytest.fixture
def bench(load_script, monkeypatch):
    """The script as a module; afterwards the environment and the default process group of its
    in-process fits are undone (Lightning writes MASTER_PORT into os.environ while its store holds
    that port: a later test's subprocess would inherit both and fail to bind)."""
    import os

    import torch.distributed as dist

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    saved = dict(os.environ)
    before = dist.is_available() and dist.is_initialized()  # a session vLLM engine's group: not ours to end
    yield load_script("bench_update")
    if not before and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def test_variants_train_the_same_rows_and_the_profile_splits_the_time(bench, tmp_path):
    data = bench.main([*TINY, "--variants", "stage1", "no_checkpointing_whole_head", "--profile", "stage1",
                       "--out-dir", str(tmp_path)])
    assert data["complete"] and data["failed"] == [] and data["skipped"] == []
    ran = {c["name"]: c for c in data["cases"]}
    assert set(ran) == {"stage1", "no_checkpointing_whole_head", "stage1 (profiled)"}
    norms = [ran[name]["measured"]["grad_norms"] for name in ran]
    assert all(n == pytest.approx(norms[0], rel=1e-5) for n in norms)  # the same rows, the same weights
    assert ran["stage1"]["speedup_vs_stage1"] == 1.0 and ran["no_checkpointing_whole_head"]["speedup_vs_stage1"] > 0
    assert "speedup_vs_stage1" not in ran["stage1 (profiled)"]  # a profiled run's seconds are not quoted
    profile = ran["stage1 (profiled)"]["profiles"][0]
    assert profile["families_ms"]["matmul"] > 0 and profile["total_ms"] >= profile["families_ms"]["matmul"]
    written = list(tmp_path.glob("cpu_*.json"))
    assert len(written) == 1


def test_a_failing_variant_is_recorded_and_the_next_runs(bench, tmp_path, monkeypatch):
    monkeypatch.setitem(bench.VARIANTS, "broken", ({"logprob_chunk_tokens": 0}, None))  # refused by the module
    data = bench.main([*TINY, "--variants", "broken", "stage1", "--profile", "--out-dir", str(tmp_path)])
    assert [c["name"] for c in data["cases"]] == ["broken", "stage1"]
    assert data["failed"][0]["name"] == "broken" and "logprob_chunk_tokens" in data["failed"][0]["reason"]
    assert data["ran"] == ["stage1"]
