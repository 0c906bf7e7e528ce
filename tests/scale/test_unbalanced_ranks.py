"""Ranks whose work differs as much as it can still run the same collectives and finish.

Rank 0 gets all-zero rewards (no row to train, every micro-batch a padding pass, the
log-prob-mismatch metric measured by an extra forward); rank 1 gets mixed rewards and some of
its responses replaced by one fixed answer (other lengths, CIW cache hits, CIW passes rank 0
does not have). Two mini-batches of micro-batches of 3 rows; FSDP2, where every forward and
backward is a collective: one forward more on one rank would hang the run, which the timeout
turns into a failure.
"""
import pytest

from fit_runs import CORRECTIONS, callbacks, read_ranks, recorder, run_fit, scalars, scripted


@pytest.mark.slow
def test_unbalanced_ranks_finish_under_fsdp2(tmp_path):
    run_fit(
        "tiny_fsdp.yaml", tmp_path,
        "--trainer.max_steps", "4",
        "--trainer.callbacks", callbacks(scripted("unbalanced"), CORRECTIONS, recorder(tmp_path)),
        "--model.algorithm.ciw", '{"mode": "ciw"}',
        "--model.rollout.num_mini_batches", "2",
        "--model.rollout.micro_batch_size", "3",
    )
    ranks = read_ranks(tmp_path, 2)
    assert all(r["steps"] == 4 for r in ranks) and ranks[0]["weights"] == ranks[1]["weights"]
    assert all(set(step["rewards"]) == {0.0} for step in ranks[0]["rollouts"])
    assert all(len(set(step["rewards"])) == 2 for step in ranks[1]["rollouts"])
    logged = scalars(tmp_path)
    # averaged over the ranks: rank 1 hit its cache and ran passes that rank 0 did not
    assert min(logged["ciw/cache_hits"].values()) > 0
    assert 0 < min(logged["ciw/forward_passes"].values())
    assert all(v > 0 for v in logged["train/grad_norm"].values())
