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
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


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
