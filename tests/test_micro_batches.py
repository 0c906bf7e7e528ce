"""Token-budget micro-batches (``rollout.micro_batch_tokens``, ``training/micro_batches.py``).

The cut itself, hand-derived; the padding pass's one-token input; and the update on the tiny
model with the budget on against off: the same loss, gradients (one SGD step of rate 1, so the
weights move by minus the gradient), metrics and log-probs to float tolerance, on rows of
different lengths with IBPO's correction rows (longer prompts) and mask-shaping token weights,
CIW-like token-weight spans, tool-masked tokens, a KL reference, a kept ``pi_old`` (two
mini-batches) and the rollout correction's weights, for GSPO and GRPO. A padding pass (a rank
that ran out of micro-batches), packed or not: one token, nothing trained, nothing counted.
Two processes under FSDP2 (padding passes of one token): tests/scale/test_micro_batch_ranks.py.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from ibpo_lit.algorithms.rollout_correction import RolloutCorrectionSettings
from ibpo_lit.config import AlgorithmConfig, IBPOConfig, OptimConfig, RolloutConfig
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.models import build_tiny_model
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.scale.collectives import RankSync
from ibpo_lit.training.assemble import assemble_update
from ibpo_lit.training.micro_batches import length_order, micro_batches, one_token_row
from ibpo_lit.training.step_types import Corrections, ScoredRollouts, StepStats, UpdateBatch
from ibpo_lit.training.update import PolicyUpdate, UpdateRuntime

BUDGET = 40  # tokens: cuts this batch's micro-batches of 3 rows into more, smaller ones


# ---------------------------------------------------------------- the cut
def _cut(prompts, responses, max_rows, max_tokens):
    rows = torch.arange(len(prompts))
    return [m.tolist() for m in micro_batches(rows, torch.tensor(prompts), torch.tensor(responses), max_rows,
                                              max_tokens)]


def test_without_a_budget_the_cut_is_rows_split():
    assert _cut([1] * 7, [5] * 7, 3, None) == [[0, 1, 2], [3, 4, 5], [6]]
    assert micro_batches(torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.zeros(0), 3) == []


def test_the_budget_counts_padded_rows_and_a_long_row_runs_alone():
    prompts, responses = [2, 2, 4, 2, 2, 30], [2, 3, 2, 4, 4, 1]
    # [0, 1]: 2 x (2 + 3) = 10; + row 2: 3 x (4 + 3) = 21 > 20, cut; [2, 3]: 2 x (4 + 4) = 16;
    # + row 4: 3 x 8 = 24 > 20, cut; [4] then row 5 alone: 31 tokens, over the budget by itself.
    assert _cut(prompts, responses, 8, 20) == [[0, 1], [2, 3], [4], [5]]
    # the row cap still holds under a budget that would take more rows
    assert _cut([1] * 5, [1] * 5, 2, 100) == [[0, 1], [2, 3], [4]]
    # a budget below every row: one row per micro-batch, none lost
    assert _cut([3, 3], [3, 3], 4, 1) == [[0], [1]]


def test_the_cut_keeps_the_order_given():
    rows = torch.tensor([4, 0, 3])
    cut = micro_batches(rows, torch.tensor([1, 1, 1, 1, 1]), torch.tensor([1, 9, 1, 1, 1]), 8, 4)
    assert [m.tolist() for m in cut] == [[4, 0], [3]]  # rows 4, 0: 2 x (1 + 1) = 4 tokens; + row 3: 6


def test_the_budget_must_be_positive():
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        RolloutConfig(micro_batch_tokens=0)
    assert RolloutConfig().micro_batch_tokens is None


def test_a_padding_pass_is_one_prompt_token_and_one_response_token():
    batch = RolloutBatch.from_lists([[5, 6, 7], [8]], [[9, 10, 11, 12], []], [[-1.0] * 4, []], [True, False],
                                    [0, 1], [0, 1], pad_token_id=0, tool_masks=[[True, False, False, False], []])
    row = one_token_row(batch)
    assert len(row) == 1 and row.prompt_ids.tolist() == [[7]] and row.response_ids.tolist() == [[9]]
    assert row.prompt_mask.all() and row.policy_mask.all()  # a real token, not tool output: a finite loss
    assert row.rollout_logp.shape == (1, 1) and row.seeds.tolist() == [0]


# ---------------------------------------------------------------- the update, budget on vs off
ROLLOUT_PROMPTS = ([5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16])
RESPONSE_LENGTHS = (1, 12, 4, 7, 9, 2, 11, 5)
REWARDS = (1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0)


def _step(vocab: int) -> ScoredRollouts:
    """2 prompts (3 and 9 tokens) x 4 responses of 1 to 12 tokens, engine log-probs away from
    the trainer's (the rollout correction has weights to compute), tool output on rows 1 and 6;
    corrections for the wrong rows, 3 of them trained with 14- and 17-token prompts."""
    g = torch.Generator().manual_seed(0)
    n = len(RESPONSE_LENGTHS)
    responses = [torch.randint(3, vocab, (length,), generator=g).tolist() for length in RESPONSE_LENGTHS]
    logps = [(-1.0 - 2.0 * torch.rand(length, generator=g)).tolist() for length in RESPONSE_LENGTHS]
    tools = [[i in (1, 6) and 3 <= t < 6 for t in range(length)] for i, length in enumerate(RESPONSE_LENGTHS)]
    rollouts = RolloutBatch.from_lists([ROLLOUT_PROMPTS[i // 4] for i in range(n)], responses, logps,
                                       [True] * n, list(range(n)), [i // 4 for i in range(n)], pad_token_id=0,
                                       tool_masks=tools)
    rewards = torch.tensor(REWARDS)
    wrong = rewards == 0
    kept = rollouts.response_mask & (torch.arange(rollouts.response_ids.shape[1]) % 3 != 0)
    train_lengths = (3, 6, 2)
    train = RolloutBatch.from_lists(
        [list(range(20, 34)), list(range(20, 34)), list(range(40, 57))],
        [torch.randint(3, vocab, (length,), generator=g).tolist() for length in train_lengths],
        [(-1.5 * torch.ones(length)).tolist() for length in train_lengths], [True] * 3, [100, 101, 102],
        [0, 0, 1], pad_token_id=0)
    corrections = Corrections(
        rewards=torch.where(wrong, 1.0, math.nan), rewrite=torch.zeros(n, dtype=torch.bool), kept_mask=kept,
        distance=torch.where(wrong, 0.3, math.nan), alpha=0.9, train_batch=train,
        train_rewards=torch.tensor([1.0, 0.0, 1.0]), train_source=torch.tensor([1, 2, 4]))
    return ScoredRollouts(prompts=[Prompt(p, "p", "1") for p in ROLLOUT_PROMPTS], rollouts=rollouts,
                          texts=[""] * n, rewards=rewards, step=0, corrections=corrections)


def _update_batch(algorithm: AlgorithmConfig, vocab: int) -> UpdateBatch:
    step = _step(vocab)
    assemble_update(step, algorithm, pad_token_id=0)
    update = step.update
    # CIW-like span weights on top of IBPO's mask weights: a span of each row zeroed, the rest 1.5
    width = update.batch.response_ids.shape[1]
    span = torch.full((len(update.batch), width), 1.5)
    span[:, 2:4] = 0.0
    update.token_weights = update.token_weights * span
    return update


@pytest.fixture(scope="module")
def model():
    """The tiny model in float64. In float32 the two cuts sum each gradient in another order and
    the CPU's vector width (AVX2 or AVX-512) changes that order again: the results differ by up to
    ~2e-5 of a tensor's largest entry, at the edge of `_close` (it failed on an AVX-512 CPU). In
    float64 they differ by under 1e-9 of it, so the comparison tests the denominators, not the
    rounding, on every CPU kind (a wrong denominator moves them by ~7x)."""
    return build_tiny_model(seed=0).double()


def _updater(algorithm, model, ref, budget, num_mini_batches, correction):
    rollout = RolloutConfig(micro_batch_size=3, micro_batch_tokens=budget, num_mini_batches=num_mini_batches)
    updater = PolicyUpdate(algorithm, rollout, OptimConfig(grad_clip=0.0), max_nonfinite_steps=5,
                           logprob_chunk_tokens=None, correction=correction)
    updater.bind(model, ref, UpdateRuntime(step_stats=StepStats()))
    return updater


def _run(algorithm, model, ref, update, budget, num_mini_batches, correction):
    """One update of a copy of ``model`` by SGD at rate 1: (weights' change, metrics, forwards)."""
    policy = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    updater = _updater(algorithm, policy, ref, budget, num_mini_batches, correction)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    forwards = []
    hook = policy.register_forward_pre_hook(lambda _m, _a, kw: forwards.append(kw["input_ids"].shape),
                                            with_kwargs=True)
    metrics = updater.run(update, optimizer, scheduler, step_index=0)
    hook.remove()
    moved = {n: p.detach() - before[n] for n, p in policy.named_parameters()}
    return moved, metrics, forwards


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = b.abs().max().item() + 1e-12
    return torch.allclose(a, b, atol=1e-5 * scale, rtol=1e-4)


CASES = {
    "gspo": dict(loss="gspo"),
    "grpo": dict(loss="grpo"),
    "gspo-kl-two-mini-batches": dict(loss="gspo", beta_kl=0.05, num_mini_batches=2),
    "grpo-rollout-correction": dict(loss="grpo", correction=RolloutCorrectionSettings("token", 2.0, ())),
    "gspo-rollout-correction-two-mini-batches": dict(loss="gspo", num_mini_batches=2,
                                                     correction=RolloutCorrectionSettings("sequence", 3.0, ())),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_update_is_the_same_with_the_budget_on(model, case):
    spec = dict(CASES[case])
    num_mini_batches, correction = spec.pop("num_mini_batches", 1), spec.pop("correction", None)
    algorithm = AlgorithmConfig(ibpo=IBPOConfig(variant="mask"), **spec)
    ref = build_tiny_model(seed=1).double().requires_grad_(False) if algorithm.beta_kl > 0 else None
    update = _update_batch(algorithm, model.config.vocab_size)
    assert (update.batch.tool_mask.any() and (update.token_weights == 0).any()
            and update.batch.prompt_mask.sum(dim=1).max() > 9)  # what the case claims to cover
    off, metrics_off, forwards_off = _run(algorithm, model, ref, update, None, num_mini_batches, correction)
    on, metrics_on, forwards_on = _run(algorithm, model, ref, update, BUDGET, num_mini_batches, correction)
    assert len(forwards_on) > len(forwards_off)  # the budget cut the micro-batches differently
    assert max(s[0] * s[1] for s in forwards_on if s[0] > 1) <= BUDGET  # every multi-row pass within it
    assert any(p.abs().max() > 0 for p in off.values())
    for name in off:
        assert _close(on[name], off[name]), name
    assert metrics_on.keys() == metrics_off.keys()
    # The loss's per-micro-batch means (clip_frac, ratio_mean, entropy, kl) are averaged weighted
    # by rows, so they move with the cut (as with another micro_batch_size); the rest may not.
    exact = [k for k in metrics_off if k.split("/")[1] not in ("clip_frac", "ratio_mean", "entropy", "kl")]
    assert {"train/loss", "train/grad_norm", "rollout/logprob_mismatch"} <= set(exact)
    assert ("train/ratio_max" in exact) == (algorithm.loss == "gspo")
    if correction is not None:
        assert {"rollout_corr/weight_mean", "rollout_corr/ratio_max"} <= set(exact)
    for key in exact:
        assert metrics_off[key] == pytest.approx(metrics_on[key], rel=1e-4, abs=1e-6, nan_ok=True), key


@pytest.mark.parametrize("budget", [1, BUDGET, 10_000])
def test_log_probs_are_the_same_with_the_budget_on(model, budget):
    algorithm = AlgorithmConfig(ibpo=IBPOConfig(variant="mask"))
    batch = _update_batch(algorithm, model.config.vocab_size).batch
    off = _updater(algorithm, model, None, None, 1, None).logprobs_no_grad(model, batch)
    counted = _updater(algorithm, model, None, budget, 1, None)
    on = counted.logprobs_no_grad(model, batch)
    mask = batch.response_mask
    assert torch.allclose(on[mask], off[mask], atol=1e-5)  # each row back in its place (padding: meaningless)
    assert counted.runtime.step_stats.no_grad_tokens == int(batch.prompt_mask.sum() + batch.response_mask.sum())


def test_the_comparison_sees_a_wrong_denominator(model):
    """The guard of the equality above, switched off: micro-batch losses over their own rows and
    tokens (not the mini-batch's) change the gradient, and `_close` says so."""
    algorithm = AlgorithmConfig(ibpo=IBPOConfig(variant="mask"))
    update = _update_batch(algorithm, model.config.vocab_size)
    good, _, _ = _run(algorithm, model, None, update, BUDGET, 1, None)
    original = PolicyUpdate.policy_loss

    def own_denominators(self, *args, **kwargs):
        kwargs.update(num_seqs=None, num_tokens=None)
        return original(self, *args, **kwargs)

    PolicyUpdate.policy_loss = own_denominators
    try:
        bad, _, _ = _run(algorithm, model, None, update, BUDGET, 1, None)
    finally:
        PolicyUpdate.policy_loss = original
    assert not all(_close(bad[name], good[name]) for name in good)


def test_the_probe_under_a_budget_is_the_shortest_rows(model):
    algorithm = AlgorithmConfig(ibpo=IBPOConfig(variant="mask"))
    batch = _update_batch(algorithm, model.config.vocab_size).batch
    rows = _updater(algorithm, model, None, BUDGET, 1, None)._probe_rows(batch)
    assert rows.tolist() == length_order(batch)[: len(rows)].tolist() and 1 <= len(rows) <= 3
    assert _updater(algorithm, model, None, None, 1, None)._probe_rows(batch).tolist() == [0, 1, 2]


# ---------------------------------------------------------------- rows of zero advantage
def test_training_zero_advantage_rows_costs_forwards_and_changes_nothing(model):
    """``rollout.train_zero_advantage_rows`` (like-for-like benchmarks against TRL, which trains
    every row): the rows of zero advantage are forwarded and counted as trained, and the update
    is the one that skips them (their gradient is exactly 0 without a KL or entropy term)."""
    algorithm = AlgorithmConfig(ibpo=IBPOConfig(variant="mask"))
    update = _update_batch(algorithm, model.config.vocab_size)
    update.advantages = update.advantages.clone()
    update.advantages[:3] = 0.0  # three rows with nothing to learn (the last row had none already)
    zero = int((update.advantages == 0).sum())
    results = {}
    for every in (False, True):
        policy = copy.deepcopy(model)
        before = {n: p.detach().clone() for n, p in policy.named_parameters()}
        stats = StepStats()
        updater = PolicyUpdate(algorithm, RolloutConfig(micro_batch_size=3, train_zero_advantage_rows=every),
                               OptimConfig(grad_clip=0.0), max_nonfinite_steps=5, logprob_chunk_tokens=None)
        updater.bind(policy, None, UpdateRuntime(step_stats=stats))
        optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
        rows = []
        hook = policy.register_forward_pre_hook(lambda _m, _a, kw: rows.append(kw["input_ids"].shape[0]),
                                                with_kwargs=True)
        updater.run(update, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), step_index=0)
        hook.remove()
        results[every] = ({n: p.detach() - before[n] for n, p in policy.named_parameters()}, sum(rows),
                          stats.trained_tokens)
    (skip, skip_rows, skip_tokens), (every, every_rows, every_tokens) = results[False], results[True]
    # the zero-advantage rows ran (each in every pass the trained rows run in) and are counted
    assert every_rows > skip_rows and (every_rows - skip_rows) % zero == 0 and every_tokens > skip_tokens
    assert any(p.abs().max() > 0 for p in skip.values())
    for name in skip:
        assert _close(every[name], skip[name]), name


class _BusierRank(RankSync):
    """One process whose `max` answers as if another rank had ``extra`` micro-batches more: the
    update then runs padding passes, as a rank that ran out does under DDP / FSDP2 (the real
    two-process run: tests/scale/test_micro_batch_ranks.py)."""

    def __init__(self, extra: int) -> None:
        super().__init__()
        self.extra = extra

    def max(self, value: int) -> int:
        return value + self.extra

    def any(self, flag: bool) -> bool:
        return bool(flag)


@pytest.mark.parametrize("packing", ["off", "on"])
def test_a_padding_pass_trains_nothing_and_costs_one_token(model, packing):
    algorithm = AlgorithmConfig(ibpo=IBPOConfig(variant="mask"))
    update = _update_batch(algorithm, model.config.vocab_size)
    results = {}
    for extra in (0, 2):
        policy = copy.deepcopy(model)
        before = {n: p.detach().clone() for n, p in policy.named_parameters()}
        stats = StepStats()
        updater = PolicyUpdate(algorithm, RolloutConfig(micro_batch_size=3, packing=packing),
                               OptimConfig(grad_clip=0.0), max_nonfinite_steps=5, logprob_chunk_tokens=None)
        updater.bind(policy, None, UpdateRuntime(sync=_BusierRank(extra), step_stats=stats))
        optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
        shapes = []
        hook = policy.register_forward_pre_hook(lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                                with_kwargs=True)
        updater.run(update, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), step_index=0)
        hook.remove()
        results[extra] = ({n: p.detach() - before[n] for n, p in policy.named_parameters()}, shapes,
                          stats.trained_tokens)
    (plain, plain_shapes, plain_tokens), (padded, padded_shapes, padded_tokens) = results[0], results[2]
    # two passes more, each of one prompt token and one response token (packed: the prompt
    # token alone, as the response's last token is not forwarded)
    assert padded_shapes[:len(plain_shapes)] == plain_shapes
    assert padded_shapes[len(plain_shapes):] == [(1, 2) if packing == "off" else (1, 1)] * 2
    # nothing trained by them, nothing counted: the same weights to the bit, the same tokens
    assert any(p.abs().max() > 0 for p in plain.values())
    assert all(torch.equal(padded[n], plain[n]) for n in plain) and padded_tokens == plain_tokens
