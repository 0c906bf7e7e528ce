"""The trainer's forward pass: log-probs of a rollout batch's response tokens.

What is covered:
    * Teacher-forced ``log pi(y_t | x, y_<t)`` of every response position, with or without
      gradient, on any Hugging Face causal LM that takes ``position_ids`` and a KV cache.
    * No work on tokens that do not need it, with the loss and gradient of the plain per-row
      forward (up to float rounding; checked in tests/test_policy_logprobs.py):
        - a prompt shared by several rows (the G samples of a group) is forwarded once; its
          KV cache is indexed out to its rows (indexing is differentiable: each prompt
          position's gradient is the sum over the rows that share it);
        - responses are forwarded on top of that cache in buckets of similar length, each
          padded to its own longest response, not the batch's (``_length_buckets``);
        - only response positions reach the LM head, and the last response token is never
          forwarded (it predicts nothing that is trained).
      Each cuts the work of a group of G responses to one prompt (the prompt is forwarded once,
      padding shrinks to each bucket's own); the step as a whole is timed by
      ``scripts/bench_throughput.py`` (docs/benchmarks.md), not here.

    * Long rows without full-vocabulary logits: with ``chunk_tokens`` set, the LM head is
      applied to at most that many positions at a time and each chunk is reduced to its tokens'
      log-probs at once (``chunked_token_logprobs``); under autograd each chunk is checkpointed,
      so backward recomputes its logits instead of keeping them. A 30k-token row of a
      152k-token vocabulary needs 18 GB of float32 logits in one piece; in chunks of 4096
      positions, 2.5 GB at a time. This runs inside the model's own forward (the head's
      ``forward`` is swapped for the duration of the call), so a head gathered by FSDP2 for that
      forward is the one used.
    * The entropy of each position's sampling distribution from the same logits
      (``response_logprobs_and_entropy``): no second pass over the vocabulary's logits. It
      carries a gradient only when asked (an entropy bonus); otherwise it is computed without
      one and costs no memory in backward.
    * Packed rows (``packing``: ``rollout.packing``, ``training/packing.py``): the rows laid end
      to end in one sequence with no padding, ``position_ids`` restarting per row, attention
      kept within each row by transformers (flash-attention's varlen kernels, flex attention's
      block mask, or a dense block-diagonal causal mask under SDPA / eager); one forward, no
      cache, only response positions reach the head (chunked or not, entropy or not), each
      log-prob put back in its row [B, Lr]. When on, it replaces the shared-prompt and per-row
      forwards, under ``single_pass`` too (it is one forward already). Same log-probs and gradient as the per-row forward up to float rounding
      (tests/test_packed_logprobs.py, SDPA on the CPU; flex attention ran on a GPU in
      ``scripts/bench_packing.py``, flash-attention's varlen path has not run). Which is faster
      where: docs/benchmarks.md#packed-forwards.
    * ``single_pass``: exactly one forward per call, whatever the rows (the plain per-row
      forward). Under FSDP2 every forward is a collective, so ranks must agree on the number of
      forwards; the shared-prompt path runs one per length bucket, which depends on the rank's
      own rows.

What is not covered:
    * Models with gradient checkpointing on in training mode: transformers turns the cache off
      there, so they take the plain per-row forward.
    * Prefix sharing between prompts that differ (only identical prompts are merged).
    * Chunking for models that transform the logits after the head (soft-capping, logit
      scales: Gemma 2/3, Cohere, Granite): they keep the full logits (``head_is_last``).
    * A fused kernel (liger-kernel's fused linear log-prob on GPU): optional future work; the
      chunked path bounds memory, not time.
"""
from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from ibpo_lit.algorithms.logprobs import token_entropy, token_logprobs
from ibpo_lit.models.compile import is_compiled
from ibpo_lit.models.hf_compat import cache_kwargs, is_activation_checkpointing, output_cache
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.packing import pack_rows, packs

BUCKET_OVERHEAD_TOKENS = 32
"""What one more forward/backward pass costs, in padded response tokens (a pass streams every
weight again); sets how finely rows are split by response length (see ``_length_buckets``)."""


# Config fields of architectures that transform the logits after the LM head.
LOGIT_TRANSFORM_FIELDS = ("final_logit_softcapping", "logit_softcapping", "logit_scale", "logits_scaling")


def _reduce(logits: Tensor, targets: Tensor, temperature: float, entropy: Optional[str]) -> Tensor:
    logp = token_logprobs(logits, targets, temperature)
    if not entropy:
        return logp
    if entropy == "grad":
        return torch.stack([logp, token_entropy(logits, temperature)], dim=-1)
    with torch.no_grad():
        values = token_entropy(logits.detach(), temperature)
    return torch.stack([logp, values], dim=-1)


# model.torch_compile: the same reduction fused by inductor (the float32 upcast, the gather and
# the log-sum-exp in one pass over the [N, V] logits instead of a float32 copy of them first).
# Wrapped on first use: `torch.compile` imports inductor (about 1 s), which a run that compiles
# nothing, and every `--help`, would otherwise pay at import.
@functools.cache
def _compiled_reduce():
    return torch.compile(_reduce)


class _Stats:
    """What the forward reduces each position's logits [..., V] to: the chosen token's log-prob
    [...] alone, or with the distribution's entropy, stacked [..., 2]; ``compiled``: through
    ``torch.compile`` (the policy's layers are compiled: ``model.torch_compile``)."""

    def __init__(self, temperature: float, entropy: Optional[str] = None, compiled: bool = False) -> None:
        self.temperature, self.entropy = temperature, entropy  # entropy: None, "value" or "grad"
        self.compiled = compiled

    @property
    def trailing(self) -> tuple[int, ...]:
        return (2,) if self.entropy else ()

    def __call__(self, logits: Tensor, targets: Tensor) -> Tensor:
        return (_compiled_reduce() if self.compiled else _reduce)(logits, targets, self.temperature, self.entropy)


def response_logprobs_and_entropy(
    model: torch.nn.Module,
    batch: RolloutBatch,
    temperature: float = 1.0,
    *,
    entropy_grad: bool = False,
    single_pass: bool = False,
    chunk_tokens: Optional[int] = None,
    packing: str = "off",
) -> tuple[Tensor, Tensor]:
    """``response_logprobs`` and, from the same logits, the entropy [B, Lr] float32 of
    ``softmax(logits / temperature)`` at every response position (with a gradient only when
    ``entropy_grad``)."""
    stats = _response_stats(model, batch, _Stats(temperature, "grad" if entropy_grad else "value"),
                            single_pass, chunk_tokens, packing)
    entropy = stats[..., 1]
    return stats[..., 0], entropy if entropy_grad else entropy.detach()


def response_logprobs(
    model: torch.nn.Module,
    batch: RolloutBatch,
    temperature: float = 1.0,
    *,
    single_pass: bool = False,
    chunk_tokens: Optional[int] = None,
    packing: str = "off",
) -> Tensor:
    """Teacher-forced ``log pi(y_t | x, y_<t)`` for every response position.

    Returns [B, Lr] float32; values at padding are meaningless and must be masked by the
    caller with ``batch.response_mask``.

    Prompts are left-padded, so ``position_ids`` come from the attention mask (each row
    starts at 0). Only response positions get logits: the prompt's logits are never used,
    and on a 49k-token vocabulary the head is a large share of the forward pass. Rows that
    share a prompt share its forward unless ``single_pass``; ``chunk_tokens`` bounds the
    positions whose logits exist at once; ``packing`` (``rollout.packing``: off, on, auto)
    packs the rows into one sequence instead (see the module docstring).
    """
    return _response_stats(model, batch, _Stats(temperature), single_pass, chunk_tokens, packing)


def _response_stats(model, batch: RolloutBatch, stats: _Stats, single_pass: bool, chunk_tokens: Optional[int],
                    packing: str = "off") -> Tensor:
    stats.compiled = is_compiled(model)  # the head's reduction compiled with the layers
    if packs(model, packing):
        packed = pack_rows(batch)
        if packed is not None:
            return _packed_logprobs(model, batch, packed, stats, chunk_tokens)
    if (
        single_pass
        or len(batch) < 2
        or batch.response_ids.shape[1] < 2
        or is_activation_checkpointing(model)
    ):
        return _per_row_logprobs(model, batch, stats, chunk_tokens)
    return _shared_prompt_logprobs(model, batch, stats, *_distinct_prompts(batch), chunk_tokens=chunk_tokens)


def _per_row_logprobs(
    model: torch.nn.Module, batch: RolloutBatch, stats, chunk_tokens: Optional[int] = None
) -> Tensor:
    """One forward of every row's prompt + response (``stats``: a temperature, or a ``_Stats``)."""
    stats = stats if isinstance(stats, _Stats) else _Stats(float(stats))
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
    attention_mask = torch.cat([batch.prompt_mask, batch.response_mask], dim=1).long()
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    lp, lr = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
    # Position Lp-1+t predicts response token t.
    predicting = torch.arange(lp - 1, lp - 1 + lr, device=input_ids.device)
    return _forward_logprobs(
        model, batch.response_ids, stats, chunk_tokens,
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
        logits_to_keep=predicting,
    )


def _packed_logprobs(model: torch.nn.Module, batch: RolloutBatch, packed, stats: _Stats,
                     chunk_tokens: Optional[int]) -> Tensor:
    """One forward of ``batch``'s rows packed end to end (``training/packing.py``), their
    response positions' ``stats`` put back in place [B, Lr(, 2)] (0 at padding)."""
    # No 2-D attention mask and no cache: that is how transformers reads restarting position_ids
    # as packed rows (masking_utils._preprocess_mask_arguments); a cache would turn it off.
    values = _forward_logprobs(
        model, packed.targets, stats, chunk_tokens,
        input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None, use_cache=False,
        logits_to_keep=packed.predicting,
    )
    mask = batch.response_mask.bool()
    out = values.new_zeros((*mask.shape, *stats.trailing))
    out[mask] = values[0]  # row-major, as pack_rows listed them (differentiable)
    return out


def _forward_logprobs(
    model: torch.nn.Module, targets: Tensor, stats: _Stats, chunk_tokens: Optional[int], **inputs
) -> Tensor:
    """[B, K(, 2)] ``stats`` of ``targets`` [B, K] at the K positions the forward keeps logits for."""
    if chunk_tokens is None or not head_is_last(model):
        return stats(model(**inputs).logits, targets)
    with logprob_head(model, targets, stats, chunk_tokens):
        return model(**inputs).logits


def head_is_last(model: torch.nn.Module) -> bool:
    """Whether the model's logits are its LM head's output unchanged (no soft-capping or
    scaling after it), so the head can be replaced by one that returns log-probs."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if model.get_output_embeddings() is None:
        return False
    return not any(getattr(c, f, None) not in (None, 1.0) for c in (config, text) for f in LOGIT_TRANSFORM_FIELDS)


@contextmanager
def logprob_head(model: torch.nn.Module, targets: Tensor, stats, chunk_tokens: int) -> Iterator[None]:
    """While the block runs, the model's LM head maps hidden states [B, K, H] to the
    log-probs [B, K] of ``targets`` [B, K] (so ``model(...).logits`` holds log-probs), in
    chunks of ``chunk_tokens`` positions. ``stats`` is a temperature (log-probs) or a ``_Stats``."""
    stats = stats if isinstance(stats, _Stats) else _Stats(float(stats))
    head = model.get_output_embeddings()
    own = head.__dict__.get("forward")  # an instance-level forward (hooks) to restore after
    head.forward = lambda hidden: chunked_token_logprobs(hidden, head, targets, stats, chunk_tokens)
    try:
        yield
    finally:
        if own is not None:
            head.forward = own
        else:
            del head.forward


def chunked_token_logprobs(
    hidden: Tensor, head: torch.nn.Module, targets: Tensor, stats, chunk_tokens: int
) -> Tensor:
    """``token_logprobs(head(hidden), targets)`` [B, K] float32 from hidden states [B, K, H]
    (or a ``_Stats``' [B, K, 2]; ``stats`` a temperature or a ``_Stats``), with logits for at
    most ``chunk_tokens`` positions alive at a time (recomputed chunk by chunk in backward)."""
    stats = stats if isinstance(stats, _Stats) else _Stats(float(stats))
    shape = (*targets.shape, *stats.trailing)
    flat, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    head_forward = type(head).forward

    def piece(h: Tensor, t: Tensor) -> Tensor:
        return stats(head_forward(head, h), t)

    if flat.shape[0] <= chunk_tokens:
        pieces = [piece(flat, flat_targets)]
    else:
        pieces = [
            checkpoint(piece, h, t, use_reentrant=False) if torch.is_grad_enabled() else piece(h, t)
            for h, t in zip(flat.split(chunk_tokens), flat_targets.split(chunk_tokens))
        ]
    # A fresh tensor, not a view: FSDP2 warns about (and cannot hook in-place ops on) views
    # returned from a sharded module's forward.
    return torch.cat(pieces).reshape(shape).clone()


def _distinct_prompts(batch: RolloutBatch) -> tuple[Tensor, Tensor]:
    """``(first, inverse)``: ``first`` [U] long, one row holding each distinct prompt;
    ``inverse`` [B] long, the distinct prompt of each row."""
    key = torch.cat([batch.prompt_ids, batch.prompt_mask.long()], dim=1)
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(len(batch), device=inverse.device)
    first = torch.full((len(distinct),), len(batch), dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return first, inverse


def _shared_prompt_logprobs(
    model: torch.nn.Module,
    batch: RolloutBatch,
    stats: _Stats,
    first: Tensor,
    inverse: Tensor,
    chunk_tokens: Optional[int] = None,
) -> Tensor:
    """Distinct prompts forwarded once [U, Lp']; then, per bucket of rows of similar response
    length, their prompts' cache indexed out and the responses but their last token forwarded on
    top of it, each bucket padded to its own longest response only."""
    prompt_mask = batch.prompt_mask[first]
    width = int(prompt_mask.sum(dim=1).max())  # these prompts' own padding only
    prompt_ids = batch.prompt_ids[first][:, -width:]
    prompt_mask = prompt_mask[:, -width:].long()  # [U, Lp']
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=(prompt_mask.cumsum(dim=1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
        **cache_kwargs(DynamicCache(config=model.config)),
    )
    prompt_cache = [(layer.keys, layer.values) for layer in output_cache(out).layers]
    response_ids = batch.response_ids
    logp = torch.zeros((*response_ids.shape, *stats.trailing), dtype=torch.float32, device=response_ids.device)
    # The last prompt position predicts response token 0.
    logp[:, 0] = stats(out.logits[:, -1][inverse], response_ids[:, 0])
    lengths = batch.response_mask.sum(dim=1)
    for rows in _length_buckets(lengths):
        n = int(lengths[rows].max())
        if n < 2:
            continue
        cache = DynamicCache(config=model.config)
        for layer, (keys, values) in enumerate(prompt_cache):  # [U, ...] -> [rows, ...], differentiable
            cache.update(keys[inverse[rows]], values[inverse[rows]], layer)
        row_prompt_mask = prompt_mask[inverse[rows]]
        inputs = response_ids[rows, : n - 1]  # token t predicts token t + 1
        steps = torch.arange(n - 1, device=inputs.device)
        logp[rows, 1:n] = _forward_logprobs(
            model, response_ids[rows, 1:n], stats, chunk_tokens,
            input_ids=inputs,
            attention_mask=torch.cat([row_prompt_mask, batch.response_mask[rows, : n - 1].long()], dim=1),
            position_ids=row_prompt_mask.sum(dim=1, keepdim=True) + steps,  # [rows, n - 1]
            use_cache=True,
            **cache_kwargs(cache),
        )
    return logp


def _length_buckets(lengths: Tensor, overhead_tokens: int = BUCKET_OVERHEAD_TOKENS) -> list[Tensor]:
    """Rows grouped so that ``sum over buckets (rows x longest response + overhead_tokens)`` is
    smallest: each bucket is padded to its own longest response, and a bucket costs about
    ``overhead_tokens`` padded tokens on its own (another pass over the weights). Exact by
    dynamic programming over the rows sorted by length (contiguous runs are optimal there)."""
    order = torch.argsort(lengths, stable=True)
    sorted_lengths = lengths[order].tolist()
    n = len(sorted_lengths)
    best = [0.0] + [math.inf] * n  # best[j]: cost of the j shortest rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # last bucket = sorted rows i..j-1, padded to sorted_lengths[j-1]
            cost = best[i] + (j - i) * sorted_lengths[j - 1] + overhead_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    buckets, j = [], n
    while j > 0:
        buckets.append(order[cut[j] : j])
        j = cut[j]
    return buckets[::-1]
