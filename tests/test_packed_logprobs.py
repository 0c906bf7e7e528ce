"""Packed forwards (``rollout.packing``, ``training/packing.py``): rows end to end in one
sequence, ``position_ids`` restarting per row, attention kept within each row.

The layout by hand; the log-probs, entropy and gradient against the padded per-row forward and
the shared-prompt path on the tiny model (fp32, SDPA: the block-diagonal mask), rows of
different lengths with shared prompts, chunked head or not; a mask that lets attention cross
rows fails the same comparison; the update (GSPO and GRPO, IBPO's correction rows, CIW-like
span weights, tool-masked tokens, a KL reference, a kept ``pi_old``, the rollout correction's
weights) packed against not: the same weights' change and metrics to float tolerance, with the
fixture and cases of tests/test_micro_batches.py. Not covered here: flash-attention's varlen
path (needs a GPU) and two processes.
"""
from __future__ import annotations

import copy
import types

import pytest
import torch
import transformers.masking_utils as masking_utils

from ibpo_lit.config import AlgorithmConfig, IBPOConfig, OptimConfig, RolloutConfig
from ibpo_lit.models import build_tiny_model
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.logprobs import _per_row_logprobs, response_logprobs, response_logprobs_and_entropy
from ibpo_lit.training.micro_batches import micro_batches, one_token_row
from ibpo_lit.training.packing import pack_rows, packs
from ibpo_lit.training.step_types import StepStats
from ibpo_lit.training.update import PolicyUpdate, UpdateRuntime
from test_micro_batches import CASES, _update_batch


# ---------------------------------------------------------------- the layout, by hand
def test_rows_are_laid_end_to_end_without_padding():
    # prompts [5, 6] (left-padded to 3) and [7, 8, 9]; responses [10, 11, 12] and [13]
    batch = RolloutBatch.from_lists([[5, 6], [7, 8, 9]], [[10, 11, 12], [13]], [[0.0] * 3, [0.0]],
                                    [True, True], [0, 1], [0, 1], pad_token_id=0)
    packed = pack_rows(batch)
    # a row's last response token predicts nothing trained: not forwarded
    assert packed.input_ids.tolist() == [[5, 6, 10, 11, 7, 8, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    # 6 predicts 10, 10 predicts 11, 11 predicts 12; 9 predicts 13
    assert packed.predicting.tolist() == [1, 2, 3, 6]
    assert packed.targets.tolist() == [[10, 11, 12, 13]]


def test_a_row_without_response_adds_nothing_and_an_empty_batch_packs_nothing():
    batch = RolloutBatch.from_lists([[5, 6], [7], [8, 9]], [[10, 11], [], [12]], [[0.0] * 2, [], [0.0]],
                                    [True] * 3, [0, 1, 2], [0, 1, 2], pad_token_id=0)
    packed = pack_rows(batch)
    assert packed.input_ids.tolist() == [[5, 6, 10, 8, 9]]
    assert packed.predicting.tolist() == [1, 2, 4]
    assert pack_rows(batch.select([1])) is None


# ---------------------------------------------------------------- which models pack
def _with_attention(name: str) -> torch.nn.Module:
    module = torch.nn.Module()
    module.config = types.SimpleNamespace(_attn_implementation=name)
    return module


def test_auto_packs_where_the_kernel_skips_other_rows_and_on_refuses_attention_that_crosses_rows():
    assert packs(_with_attention("flash_attention_2"), "auto") and packs(_with_attention("flex_attention"), "auto")
    assert not packs(_with_attention("sdpa"), "auto")
    assert packs(_with_attention("sdpa"), "on") and packs(_with_attention("eager"), "on")
    assert not packs(_with_attention("flash_attention_2"), "off")
    with pytest.raises(ValueError, match="rollout.packing: on"):
        packs(_with_attention("paged|sdpa"), "on")
    assert not packs(_with_attention("paged|sdpa"), "auto")
    with pytest.raises(ValueError, match="rollout.packing"):
        RolloutConfig(packing="yes")


# ---------------------------------------------------------------- log-probs and gradients
@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def batch(model):
    """3 prompts (2, 6 and 11 tokens) x 3 samples, responses of 1 to 17 tokens, seeded."""
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (2, 6, 11)]
    lengths = (3, 17, 1, 9, 4, 12, 2, 7, 15)
    responses = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
    return RolloutBatch.from_lists([prompts[i // 3] for i in range(9)], responses, [[-1.0] * n for n in lengths],
                                   [True] * 9, list(range(9)), [i // 3 for i in range(9)], pad_token_id=0)


def _logp_and_grads(model, batch, **kwargs):
    model.train()  # (no dropout in the tiny model: train mode changes nothing but the flag)
    model.zero_grad(set_to_none=True)
    logp, entropy = response_logprobs_and_entropy(model, batch, 0.8, entropy_grad=True, **kwargs)
    mask = batch.response_mask
    # every position weighted differently, so a value put back in the wrong place shows in the gradient
    weights = torch.linspace(0.5, 1.5, mask.numel()).view_as(logp)
    ((logp * weights * mask).sum() + 0.1 * (logp * mask).pow(2).sum() + 0.05 * (entropy * mask).sum()).backward()
    return logp.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("chunk_tokens", [None, 5])
def test_packed_log_probs_entropy_and_gradient_equal_the_padded_forwards(model, batch, chunk_tokens):
    mask = batch.response_mask
    packed = _logp_and_grads(model, batch, packing="on", chunk_tokens=chunk_tokens)
    for other in (dict(single_pass=True), dict()):  # the per-row forward, the shared-prompt path
        expected = _logp_and_grads(model, batch, chunk_tokens=chunk_tokens, **other)
        for got, want in zip(packed[:2], expected[:2]):
            assert (got - want)[mask].abs().max() < 1e-5
        for g, e in zip(packed[2], expected[2]):
            assert torch.allclose(g, e, rtol=1e-4, atol=1e-6)
    assert (packed[0][~mask] == 0).all()


def test_qwen3_with_gradient_checkpointing(batch):
    """Another architecture (Qwen3's q/k norms), with activation checkpointing on in train mode
    (where the shared-prompt path is off: transformers drops the cache there); packing needs no cache."""
    model = build_tiny_model(seed=2, arch="qwen3")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mask = batch.response_mask
    packed = _logp_and_grads(model, batch, packing="on")
    expected = _logp_and_grads(model, batch, single_pass=True)
    assert (packed[0] - expected[0])[mask].abs().max() < 1e-5
    for g, e in zip(packed[2], expected[2]):
        assert torch.allclose(g, e, rtol=1e-4, atol=1e-6)


def test_attention_across_rows_fails_the_comparison(model, batch, monkeypatch):
    """The guard switched off: transformers told the sequence is not packed (a plain causal
    mask over the whole sequence, positions still restarting), later rows see earlier ones."""
    with torch.no_grad():
        expected = _per_row_logprobs(model, batch, 0.8)
        assert (response_logprobs(model, batch, 0.8, packing="on") - expected)[batch.response_mask].abs().max() < 1e-5
        monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
        crossed = response_logprobs(model, batch, 0.8, packing="on")
    assert (crossed - expected)[batch.response_mask].abs().max() > 1e-2


def test_one_forward_whatever_the_rows_and_a_padding_pass(model, batch):
    shapes = []
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: shapes.append(kw["input_ids"].shape), with_kwargs=True)
    try:
        with torch.no_grad():
            response_logprobs(model, batch, 1.0, packing="on")
            padding = one_token_row(batch)
            assert torch.allclose(response_logprobs(model, padding, 1.0, packing="on"),
                                  _per_row_logprobs(model, padding, 1.0))
    finally:
        hook.remove()
    real = int(batch.prompt_mask.sum() + batch.response_mask.sum()) - len(batch)
    assert shapes[:2] == [torch.Size([1, real]), torch.Size([1, 1])]


# ---------------------------------------------------------------- the cut under a budget
def test_a_packed_budget_counts_real_tokens():
    rows = torch.arange(4)
    prompts, responses = torch.tensor([2, 2, 9, 2]), torch.tensor([3, 4, 1, 10])
    # real tokens 5, 6, 10, 12; padded, rows 0-1 cost 2 x 6 = 12 and rows 0-2 3 x 13 = 39
    assert [m.tolist() for m in micro_batches(rows, prompts, responses, 8, 21, packed=True)] == [[0, 1, 2], [3]]
    assert [m.tolist() for m in micro_batches(rows, prompts, responses, 8, 21)] == [[0, 1], [2], [3]]
    assert [m.tolist() for m in micro_batches(rows, prompts, responses, 2, 100, packed=True)] == [[0, 1], [2, 3]]


# ---------------------------------------------------------------- the update, packed vs not
BUDGET = 40


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to float rounding, on the scale of the whole tensor: the rollout correction's
    weights (exp of a log-prob difference) amplify the forwards' rounding to ~2e-5 of the
    largest gradient entry on the GRPO case (the budget alone, unpacked, gives 1.1e-5)."""
    scale = b.abs().max().item() + 1e-12
    return torch.allclose(a, b, atol=5e-5 * scale, rtol=1e-4)


def _run(algorithm, model, ref, update, packing, num_mini_batches, correction, budget=BUDGET):
    policy = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    rollout = RolloutConfig(micro_batch_size=3, micro_batch_tokens=budget, num_mini_batches=num_mini_batches,
                            packing=packing)
    updater = PolicyUpdate(algorithm, rollout, OptimConfig(grad_clip=0.0), max_nonfinite_steps=5,
                           logprob_chunk_tokens=None, correction=correction)
    stats = StepStats()
    updater.bind(policy, ref, UpdateRuntime(step_stats=stats))
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    forwards = []
    hook = policy.register_forward_pre_hook(lambda _m, _a, kw: forwards.append(kw["input_ids"].shape),
                                            with_kwargs=True)
    metrics = updater.run(update, optimizer, scheduler, step_index=0)
    hook.remove()
    moved = {n: p.detach() - before[n] for n, p in policy.named_parameters()}
    return moved, metrics, forwards, stats


@pytest.mark.parametrize("case", list(CASES))
def test_the_update_is_the_same_packed(model, case):
    spec = dict(CASES[case])
    num_mini_batches, correction = spec.pop("num_mini_batches", 1), spec.pop("correction", None)
    algorithm = AlgorithmConfig(ibpo=IBPOConfig(variant="mask"), **spec)
    ref = build_tiny_model(seed=1).requires_grad_(False) if algorithm.beta_kl > 0 else None
    update = _update_batch(algorithm, model.config.vocab_size)
    assert update.batch.tool_mask.any() and (update.token_weights == 0).any()  # what the case claims to cover
    off, metrics_off, _, stats_off = _run(algorithm, model, ref, update, "off", num_mini_batches, correction, None)
    on, metrics_on, forwards_on, stats_on = _run(algorithm, model, ref, update, "on", num_mini_batches, correction)
    assert all(s[0] == 1 for s in forwards_on) and max(s[1] for s in forwards_on) <= BUDGET  # packed, in budget
    assert any(s[1] > 20 for s in forwards_on)  # several rows in one sequence
    assert any(p.abs().max() > 0 for p in off.values())
    for name in off:
        assert _close(on[name], off[name]), name
    assert (stats_on.trained_tokens, stats_on.no_grad_tokens) == (stats_off.trained_tokens, stats_off.no_grad_tokens)
    # per-micro-batch means (clip_frac, ratio_mean, entropy, kl) are averaged by rows: they move with the cut
    exact = [k for k in metrics_off if k.split("/")[1] not in ("clip_frac", "ratio_mean", "entropy", "kl")]
    assert {"train/loss", "train/grad_norm", "rollout/logprob_mismatch"} <= set(exact)
    for key in exact:
        assert metrics_off[key] == pytest.approx(metrics_on[key], rel=1e-4, abs=1e-6, nan_ok=True), key


def test_the_update_comparison_sees_attention_across_rows(model, monkeypatch):
    """The guard of the update's equality, switched off: packed rows that attend to each other."""
    algorithm = AlgorithmConfig(ibpo=IBPOConfig(variant="mask"))
    update = _update_batch(algorithm, model.config.vocab_size)
    good = _run(algorithm, model, None, update, "on", 1, None)[0]
    assert all(_close(good[name], value) for name, value in _run(algorithm, model, None, update, "off", 1, None,
                                                                   None)[0].items())
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    crossed = _run(algorithm, model, None, update, "on", 1, None)[0]
    assert not all(_close(crossed[name], good[name]) for name in good)


def test_auto_under_sdpa_is_todays_path_bit_for_bit(model):
    algorithm = AlgorithmConfig(ibpo=IBPOConfig(variant="mask"))
    update = _update_batch(algorithm, model.config.vocab_size)
    off, metrics_off, forwards_off, _ = _run(algorithm, model, None, update, "off", 1, None)
    auto, metrics_auto, forwards_auto, _ = _run(algorithm, model, None, update, "auto", 1, None)
    assert forwards_auto == forwards_off and any(rows > 1 for rows, _ in forwards_off)  # not packed
    assert all(torch.equal(auto[name], off[name]) for name in off)
    assert metrics_auto == metrics_off
