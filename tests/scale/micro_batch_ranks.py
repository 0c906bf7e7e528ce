"""Token-budget micro-batches on 2 FSDP2 processes, run by tests/scale/test_micro_batch_ranks.py
as ``python -m torch.distributed.run --nproc_per_node 2 micro_batch_ranks.py OUT_DIR``.

Rank 0 holds 6 rows of 5 to 14 response tokens, rank 1 two short ones: under a token budget
rank 0 runs several micro-batches and rank 1 one, then padding passes (of one token) in
lockstep; every forward and backward is a collective, so a pass more on one rank would hang.
One update (SGD, rate 1: the weights move by minus the gradient) with the budget on and off,
each against the gradient of the plain model's loss over both ranks' rows in one forward; and
the no-grad log-probs (pi_old, the reference) with the budget; and the update once more with
the budget and ``rollout.packing: on`` (each micro-batch one packed row); and with
``rollout.balance_ranks`` (rows dealt anew by length: 4 and 4, so fewer lockstep passes), the
gradient still the plain model's, packed or not, and over two mini-batches (two SGD steps,
pi_old kept, a KL term to a reference) the weights those of the same run undealt. Each rank writes
``OUT_DIR/rank<r>.json``."""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ibpo_lit.algorithms.rollout_correction import RolloutCorrectionSettings
from ibpo_lit.config import AlgorithmConfig, OptimConfig, RolloutConfig
from ibpo_lit.models.loading import build_builtin_model, load_sharded_policy
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.scale.collectives import RankSync
from ibpo_lit.scale.fsdp2 import FSDP2Plan
from ibpo_lit.training.step_types import StepStats, UpdateBatch
from ibpo_lit.training.update import PolicyUpdate, UpdateRuntime

BUDGET = 30
LENGTHS = (5, 14, 9, 6, 12, 7, 3, 2)  # responses; rows 0-5 on rank 0, 6-7 on rank 1
MINE = ([0, 1, 2, 3, 4, 5], [6, 7])
CORRECTION = RolloutCorrectionSettings("token", 2.0, ())


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def every_row(vocab: int) -> UpdateBatch:
    g = torch.Generator().manual_seed(0)
    n = len(LENGTHS)
    prompts = [torch.randint(3, vocab, (3 + i % 3,), generator=g).tolist() for i in range(n)]
    responses = [torch.randint(3, vocab, (length,), generator=g).tolist() for length in LENGTHS]
    logps = [(-1.0 - 2.0 * torch.rand(length, generator=g)).tolist() for length in LENGTHS]
    batch = RolloutBatch.from_lists(prompts, responses, logps, [True] * n, list(range(n)), [i // 4 for i in range(n)],
                                    pad_token_id=0)
    weights = 0.5 + torch.rand(n, batch.response_ids.shape[1], generator=g)
    return UpdateBatch(batch=batch, advantages=torch.randn(n, generator=g), token_weights=weights)


def updater(budget, model, sync=None, world=1, packing="off", balance=False, minis=1, ref=None) -> PolicyUpdate:
    rollout = RolloutConfig(micro_batch_size=3, micro_batch_tokens=budget, packing=packing, balance_ranks=balance,
                            num_mini_batches=minis)
    algorithm = AlgorithmConfig(loss="gspo", beta_kl=0.05 if ref is not None else 0.0)
    update = PolicyUpdate(algorithm, rollout,
                          OptimConfig(grad_clip=0.0), max_nonfinite_steps=5, logprob_chunk_tokens=None,
                          correction=CORRECTION)
    update.bind(model, ref, UpdateRuntime(sync=sync or RankSync(), world_size=world, step_stats=StepStats()))
    return update


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    reference = build_builtin_model("tiny-qwen3", seed=3)
    everything = every_row(reference.config.vocab_size)
    mine = torch.tensor(MINE[rank])
    local = UpdateBatch(everything.batch.select(mine), everything.advantages[mine], everything.token_weights[mine])
    local.token_weights = local.token_weights[:, : local.batch.response_ids.shape[1]]

    # the reference gradient: one forward of every row of both ranks, the loss over all of them
    plain = updater(None, reference)
    loss, _ = plain.policy_loss(everything.batch, everything.advantages, everything.token_weights)
    expected = dict(zip([n for n, _ in reference.named_parameters()],
                        torch.autograd.grad(loss, list(reference.parameters()))))
    out, moves = {}, {}
    runs = (("on", BUDGET, "off", False, 1), ("off", None, "off", False, 1), ("packed", BUDGET, "on", False, 1),
            ("balanced", BUDGET, "off", True, 1), ("balanced_packed", BUDGET, "on", True, 1),
            ("minis", BUDGET, "off", False, 2), ("minis_balanced", BUDGET, "off", True, 2))
    for label, budget, packing, balance, minis in runs:
        model, _ = load_sharded_policy("tiny-qwen3", FSDP2Plan(mesh=mesh), seed=3)
        before = {n: full(p).detach().clone() for n, p in model.named_parameters()}
        forwards = []
        hook = model.register_forward_pre_hook(lambda _m, _a, kw: forwards.append(list(kw["input_ids"].shape)),
                                               with_kwargs=True)
        # two mini-batches: pi_old kept, and a KL term to a reference (the initial weights)
        ref = load_sharded_policy("tiny-qwen3", FSDP2Plan(mesh=mesh), seed=3)[0] if minis > 1 else None
        update = updater(budget, model, RankSync(world), world, packing, balance, minis, ref)
        if label == "on":
            # pi_old / the reference: no-grad log-probs in lockstep passes, back in row order
            logp = update.logprobs_no_grad(model, local.batch)
            want = plain.logprobs_no_grad(reference, local.batch)
            out["logp_max_diff"] = float(((logp - want) * local.batch.response_mask).abs().max())
            out["logp_forwards"], forwards = forwards, []
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        metrics = update.run(local, optimizer, scheduler, step_index=0)
        hook.remove()
        moved = moves[label] = {n: before[n] - full(p).detach() for n, p in model.named_parameters()}
        out[f"{label}_forwards"] = forwards  # pi_old's, the reference's and the update's
        if minis > 1:  # two optimizer steps: the dealt run against the undealt one
            continue
        out[f"{label}_grad_max_diff"] = max(float((moved[n] - expected[n]).abs().max()) for n in expected)
        out[f"{label}_grad_max"] = max(float(g.abs().max()) for g in expected.values())
        out[f"{label}_loss"] = metrics["train/loss"]
    out["expected_loss"] = float(loss)
    dealt, undealt = moves["minis_balanced"], moves["minis"]
    out["minis_weight_diff"] = max(float((undealt[n] - dealt[n]).abs().max()) for n in expected)
    out["minis_weight_moved"] = max(float(moves["minis"][n].abs().max()) for n in expected)

    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    from rank_exit import end_processes  # tests/scale, on the workers' path

    end_processes()


if __name__ == "__main__":
    main(sys.argv[1])
