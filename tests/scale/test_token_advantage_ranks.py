"""REINFORCE++'s global batch normalisation on 2 CPU processes (gloo): each rank holds its share
of the rows, and the mean and variance over the tokens are the whole run's (``RankSync.sum`` of
the count, the sum and the squared deviations), so every rank's advantages equal the rows of one
process whitening the whole batch.

The module fixture starts this file as a script under ``python -m torch.distributed.run
--nproc_per_node 2``; each rank writes ``OUT_DIR/rank<r>.json``. Cases: an uneven split (3 rows
and 5, other widths), a rank with no scorable row (it still runs every collective), and the
assembled update (``assemble_update`` with the run's ``RankSync``, the KL from a stand-in
reference). And a fit under FSDP2 (``configs/tiny_fsdp.yaml``) where rank 1's groups all tie:
the reference's forward before the advantages is a collective too, and with no group baseline
rank 1 trains every row.

The group-relative scales with a batch-wide std ("batch", "reinforce_plus_plus_baseline") the
same way: each rank holds whole groups, the std is over both ranks' rows, including a rank with no
rows at all; and an assembled update where only rank 0 has correction samples to train (rank 1
still takes part in the correction advantages' sums, or the run would hang).
"""
import json
import math
import sys

import pytest
import torch

from fit_runs import CORRECTIONS, HERE, callbacks, read_ranks, recorder, run_fit, scalars, scripted, two_process_results

SPLIT = 3  # rank 0 holds rows [0, 3), rank 1 the rest
RPP = "reinforce_plus_plus"


def _batch(case):
    gen = torch.Generator().manual_seed(11)
    B, T = 8, 9
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    kl = torch.rand(B, T, generator=gen) * 0.3
    rewards = torch.randint(0, 2, (B,), generator=gen).float()
    if case == "empty_rank":
        rewards[:SPLIT] = math.nan
    return rewards, kl, mask


def _rows(rank):
    return slice(0, SPLIT) if rank == 0 else slice(SPLIT, None)


def _formula(case, rows, total=None):
    from ibpo_lit.algorithms import TokenAdvantageSettings, reinforce_plus_plus_advantages

    rewards, kl, mask = _batch(case)
    width = int(mask[rows].sum(-1).max())  # each rank's own padding
    return reinforce_plus_plus_advantages(rewards[rows], kl[rows, :width], mask[rows, :width],
                                          TokenAdvantageSettings(kl_coef=0.2, gamma=0.9), total)


def _assembled(rows, sync=None):
    from ibpo_lit.config import AlgorithmConfig, IBPOConfig
    from ibpo_lit.data.prompt import Prompt
    from ibpo_lit.rollout.batch import RolloutBatch
    from ibpo_lit.scale.collectives import SINGLE_PROCESS
    from ibpo_lit.training.assemble import assemble_update
    from ibpo_lit.training.step_types import ScoredRollouts

    rewards, kl, mask = _batch("assembled")
    lengths = mask.sum(-1)[rows].tolist()
    logps = [[-1.0 - 0.1 * t for t in range(n)] for n in lengths]
    n = len(lengths)
    batch = RolloutBatch.from_lists([[5, 6]] * n, [[7] * k for k in lengths], logps, [True] * n, list(range(n)),
                                    [i // 2 for i in range(n)], pad_token_id=0)
    step = ScoredRollouts(prompts=[Prompt([5, 6], "p", "1")] * n, rollouts=batch, texts=[""] * n,
                          rewards=rewards[rows], step=0)
    algo = AlgorithmConfig(advantage_scale=RPP, beta_kl=0.1, ibpo=IBPOConfig(variant="none"))
    assemble_update(step, algo, 0, None, lambda b: torch.where(b.response_mask, b.rollout_logp - 0.05, 0.0),
                    sync or SINGLE_PROCESS)
    return step.update.advantages


BATCH_SCALES = ("batch", "reinforce_plus_plus_baseline")
GROUPS = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 4, 4, 4])  # ragged groups, whole on a rank


def _group_rows(case, rank):
    """Rank 0 holds groups 0-1 (none in "empty_rank"), rank 1 the rest; None: every row."""
    first = 0 if case == "empty_rank" else 5
    if rank is None:
        return slice(None)
    return slice(0, first) if rank == 0 else slice(first, None)


def _grouped(scale, case, rank=None, total=None):
    from ibpo_lit.algorithms import grouped_advantages

    gen = torch.Generator().manual_seed(5)
    rewards = torch.rand(len(GROUPS), generator=gen).round(decimals=1)
    rewards[6] = math.nan  # an unscorable row: out of the std's count on every rank
    rows = _group_rows(case, rank)
    return grouped_advantages(rewards[rows], GROUPS[rows], scale, total)


def _assembled_batch_scale(rank=None, sync=None):
    """Scale "batch", 2 rollouts a prompt; rank 0 has 2 correction samples to train (their
    groups numbered after its prompts'), rank 1 none. rank None: one process, every rollout
    and rank 0's corrections."""
    from ibpo_lit.config import AlgorithmConfig, IBPOConfig
    from ibpo_lit.data.prompt import Prompt
    from ibpo_lit.rollout.batch import RolloutBatch
    from ibpo_lit.scale.collectives import SINGLE_PROCESS
    from ibpo_lit.training.assemble import assemble_update
    from ibpo_lit.training.step_types import Corrections, ScoredRollouts

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.0])
    rows = slice(None) if rank is None else slice(0, 4) if rank == 0 else slice(4, None)
    n = len(rewards[rows])
    batch = RolloutBatch.from_lists([[5, 6]] * n, [[7, 8]] * n, [[-1.0, -1.0]] * n, [True] * n, list(range(n)),
                                    [i // 2 for i in range(n)], pad_token_id=0)
    step = ScoredRollouts(prompts=[Prompt([5, 6], "p", "1")] * n, rollouts=batch, texts=[""] * n,
                          rewards=rewards[rows], step=0)
    train = rank != 1
    extra = RolloutBatch.from_lists([[8, 9]] * 3, [[3, 4]] * 3, [[-0.5, -0.5]] * 3, [True] * 3, [11, 12, 13],
                                    [0, 0, 0], pad_token_id=0)
    step.corrections = Corrections(
        rewards=torch.full((n,), math.nan), rewrite=torch.zeros(n, dtype=torch.bool),
        kept_mask=torch.zeros(n, 2, dtype=torch.bool), distance=torch.full((n,), math.nan), alpha=0.6,
        train_batch=extra if train else None, train_rewards=torch.tensor([1.0, 0.0, 0.0]) if train else None,
        train_source=torch.tensor([1, 1, 1]) if train else None)
    algo = AlgorithmConfig(advantage_scale="batch", ibpo=IBPOConfig(variant="none"))
    assemble_update(step, algo, 0, None, None, sync or SINGLE_PROCESS)
    return step.update.advantages


def main(out_dir: str) -> None:
    from pathlib import Path

    import torch.distributed as dist

    from ibpo_lit.scale.collectives import RankSync

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = RankSync(world)
    rows = _rows(rank)
    out = {case: _formula(case, rows, sync.sum).tolist() for case in ("uneven", "empty_rank")}
    out["assembled"] = _assembled(rows, sync).tolist()
    for scale in BATCH_SCALES:
        for case in ("uneven", "empty_rank"):
            out[f"{scale}/{case}"] = _grouped(scale, case, rank, sync.sum).tolist()
    out["batch/assembled"] = _assembled_batch_scale(rank, sync).tolist()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    from rank_exit import end_processes  # tests/scale, on the workers' path

    end_processes()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return two_process_results(HERE / "test_token_advantage_ranks.py", tmp_path_factory.mktemp("token_adv_ranks"))


def _by_rank(full, r):
    return full[_rows(r)]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["uneven", "empty_rank"])
def test_each_rank_gets_its_rows_of_the_whole_batch_whitened(ranks, case):
    full = _formula(case, slice(None))
    for r in (0, 1):
        got = torch.tensor(ranks[r][case])
        torch.testing.assert_close(got, _by_rank(full, r)[:, : got.shape[1]], rtol=1e-5, atol=1e-6)
    if case == "empty_rank":  # nothing scorable on rank 0: zeros there, rank 1's own statistics
        assert torch.equal(torch.tensor(ranks[0][case]), torch.zeros_like(torch.tensor(ranks[0][case])))
    else:  # a rank whitening alone would differ: the statistics really are the union's
        alone = _formula(case, _rows(1))
        assert not torch.allclose(alone, torch.tensor(ranks[1][case]), atol=1e-3)


@pytest.mark.slow
def test_assembled_update_whitens_over_both_ranks(ranks):
    full = _assembled(slice(None))
    for r in (0, 1):
        got = torch.tensor(ranks[r]["assembled"])
        torch.testing.assert_close(got, _by_rank(full, r)[:, : got.shape[1]], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["uneven", "empty_rank"])
@pytest.mark.parametrize("scale", BATCH_SCALES)
def test_batch_scales_divide_by_the_std_of_both_ranks_rows(ranks, scale, case):
    full = _grouped(scale, case)
    for r in (0, 1):
        got = torch.tensor(ranks[r][f"{scale}/{case}"])
        torch.testing.assert_close(got, full[_group_rows(case, r)], rtol=1e-5, atol=1e-6)
    if case == "uneven":  # a rank scaling alone would differ: the std really is the union's
        assert not torch.allclose(_grouped(scale, case, 1), full[_group_rows(case, 1)], atol=1e-3)
    else:  # no rows on rank 0, and it took part in the sums all the same
        assert ranks[0][f"{scale}/{case}"] == []


@pytest.mark.slow
def test_assembled_batch_scale_with_corrections_on_one_rank(ranks):
    full = _assembled_batch_scale()  # rollouts 0-7, then rank 0's 3 correction samples
    torch.testing.assert_close(torch.tensor(ranks[0]["batch/assembled"]), torch.cat([full[:4], full[8:]]))
    torch.testing.assert_close(torch.tensor(ranks[1]["batch/assembled"]), full[4:8])


@pytest.mark.slow
def test_fit_under_fsdp2_with_the_kl_in_the_reward(tmp_path):
    run_fit("tiny_fsdp.yaml", tmp_path, "--trainer.max_steps", "3",
            "--trainer.callbacks", callbacks(scripted("idle_rank"), CORRECTIONS, recorder(tmp_path)),
            "--model.algorithm.advantage_scale", RPP, "--model.algorithm.beta_kl", "0.01",
            "--model.rollout.micro_batch_size", "3")
    ranks = read_ranks(tmp_path, 2)
    assert all(r["steps"] == 3 for r in ranks) and ranks[0]["weights"] == ranks[1]["weights"]
    logged = scalars(tmp_path)
    assert logged["train/kl"][0] == pytest.approx(0.0, abs=1e-6)  # the first step's policy is the reference
    assert all(math.isfinite(v) for v in logged["train/loss"].values())
    assert set(logged["train/zero_adv_frac"].values()) == {0.0}  # rank 1's tied groups train too


if __name__ == "__main__":
    main(sys.argv[1])
