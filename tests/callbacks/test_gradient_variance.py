"""GradientVarianceLogger on real steps of the tiny model, against an independent
recomputation of each split's gradient (one forward per split, no micro-batches, no skipped
rows) made at the same weights, in a callback placed after it."""
from __future__ import annotations

import os
import re
import sys
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from callbacks.gradient_variance import GradientVarianceLogger
from ibpo_lit.__main__ import main
from ibpo_lit.experiments.runs import read_scalars

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")
FILTER = r"embed_tokens|layers\.0\."
K, SEED, STEPS = 4, 5, 1


class RandomAdvantages(Callback):
    """Before the logger: a random tiny model rarely earns a reward, so every advantage would be
    0 and every gradient 0. Seeded N(0, 1) advantages, with every third row left at 0 (the
    logger skips their forward but counts them), make the gradients non-trivial."""

    def on_before_update(self, trainer, pl_module, step):
        adv = torch.randn(len(step.update.advantages), generator=torch.Generator().manual_seed(step.step))
        adv[::3] = 0.0
        step.update.advantages = adv


def flat_grad(pl_module, update, rows, params):
    """Gradient of the loss averaged over ``rows``: one forward, every row, default denominators."""
    w = update.token_weights[rows] if update.token_weights is not None else None
    loss, _ = pl_module.updater.policy_loss(update.batch.select(rows), update.advantages[rows], w)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])


class Check(Callback):
    """After the logger: recomputes what it measured, before the step's update moves the weights."""

    def __init__(self, logger):
        self.logger = logger
        self.seen = []

    def on_before_update(self, trainer, pl_module, step):
        update = step.update
        names = [n for n, _ in pl_module.policy.named_parameters() if re.search(FILTER, n)]
        params = [p for n, p in pl_module.policy.named_parameters() if re.search(FILTER, n)]
        n = len(update.batch)
        splits = GradientVarianceLogger.split_rows(n, K, SEED, step.step)
        grads = torch.stack([flat_grad(pl_module, update, rows, params) for rows in splits]).double()
        full = flat_grad(pl_module, update, torch.arange(n), params).double()
        if n % K == 0:  # equal sizes already (n = 32 with these seeds): the plain mean of the splits
            equal_mean, equal_full = grads.mean(0), full
        else:  # two equal halves of the first rows
            halves = torch.randperm(n - n % 2, generator=torch.Generator().manual_seed(1)).chunk(2)
            equal_mean = sum(flat_grad(pl_module, update, rows, params).double() for rows in halves) / 2
            equal_full = flat_grad(pl_module, update, torch.cat(halves), params).double()
        self.seen.append({
            "last": dict(self.logger.last), "names": names, "n": n, "splits": splits, "grads": grads, "full": full,
            "equal_mean": equal_mean, "equal_full": equal_full,
            "grads_untouched": all(p.grad is None for p in pl_module.policy.parameters()),
            "zero_adv_rows": int((update.advantages == 0).sum()),
        })


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    sys.argv = sys.argv[:1]
    cli = main(["--config", TINY, "--trainer.max_steps", str(STEPS),
                "--trainer.default_root_dir", str(tmp_path_factory.mktemp("gradvar")),
                "--trainer.enable_progress_bar", "false", "--model.rollout.sampling.max_new_tokens", "8",
                "--model.rollout.micro_batch_size", "8"],  # the logger accumulates over micro-batches
               run=False)
    logger = GradientVarianceLogger(every_n_steps=1, num_splits=K, param_filter=FILTER, seed=SEED)
    check = Check(logger)
    cli.trainer.callbacks += [RandomAdvantages(), logger, check]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli, logger, check.seen


def test_split_gradients_match_an_independent_recomputation(run):
    cli, logger, seen = run
    assert len(seen) == STEPS
    for s in seen:
        last, g = s["last"], s["grads"]
        assert last["param_names"] == s["names"] and len(s["names"]) == 10  # embeddings + layer 0's 9 tensors
        assert last["num_elements"] == g.shape[1]
        assert [r.tolist() for r in last["splits"]] == [r.tolist() for r in s["splits"]]
        # disjoint, covering, near-equal
        assert sorted(torch.cat(s["splits"]).tolist()) == list(range(s["n"]))
        assert max(map(len, s["splits"])) - min(map(len, s["splits"])) <= 1
        # trace = sum_d sum_k (g_kd - mean_d)^2 / (K - 1); ||mean||^2
        trace = ((g - g.mean(0)) ** 2).sum() / (K - 1)
        assert last["trace"] == pytest.approx(trace.item(), rel=1e-4)
        assert last["mean_sq_norm"] == pytest.approx((g.mean(0) ** 2).sum().item(), rel=1e-4)
        assert last["mean_sq_norm"] > 0 and s["zero_adv_rows"] > 0  # the test exercises something
        assert last["relative"] == pytest.approx(last["trace"] / last["mean_sq_norm"])
        assert s["grads_untouched"]  # autograd.grad, not backward: the module's .grad stays as it was
    logged = read_scalars(cli.trainer.default_root_dir, ["grad_var/trace", "grad_var/seconds"])
    assert len(logged["grad_var/trace"]) == STEPS  # one point per measurement, none repeated
    assert logged["grad_var/trace"][-1][1] == pytest.approx(seen[-1]["last"]["trace"], rel=1e-5)
    assert all(v > 0 for _, v in logged["grad_var/seconds"])


def test_per_split_means_recombine_to_the_full_batch_gradient(run):
    _, _, seen = run
    for s in seen:
        sizes = torch.tensor([len(r) for r in s["splits"]], dtype=torch.float64)
        weighted = (sizes[:, None] * s["grads"]).sum(0) / sizes.sum()  # sum_k (n_k / N) g_k
        scale = s["full"].abs().max().item() + 1e-12
        assert torch.allclose(weighted, s["full"], atol=1e-5 * scale, rtol=1e-4)
        # equal split sizes: the plain mean of the split gradients is the full-batch gradient
        assert torch.allclose(s["equal_mean"], s["equal_full"], atol=1e-5 * scale, rtol=1e-4)


def test_arguments_and_skips():
    for bad in ({"every_n_steps": 0}, {"num_splits": 1}, {"max_params": 0}, {"param_filter": "("}):
        with pytest.raises(ValueError):
            GradientVarianceLogger(**bad)
    logger = GradientVarianceLogger(every_n_steps=2, num_splits=4)
    trainer = SimpleNamespace(world_size=1)
    few = SimpleNamespace(step=0, update=SimpleNamespace(batch=[0, 1, 2]))  # 3 rows < 4 splits
    with pytest.warns(UserWarning, match="num_splits"):
        logger.on_before_update(trainer, None, few)
    logger.on_before_update(trainer, None, SimpleNamespace(step=1, update=None))  # not a measuring step
    assert logger.last is None


def test_parameter_selection():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    names, params = GradientVarianceLogger(param_filter=r"^2\.").select_parameters(model)
    assert names == ["2.weight", "2.bias"] and params[0] is model[2].weight
    names, _ = GradientVarianceLogger(max_params=3).select_parameters(model)
    assert names == ["0.weight", "0.bias", "2.weight"]
    with pytest.raises(ValueError, match="no trainable parameter"):
        GradientVarianceLogger(param_filter="nothing").select_parameters(model)
