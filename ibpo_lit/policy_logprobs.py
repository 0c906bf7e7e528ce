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
      Measured on SmolLM2, 2 prompts x 8 responses of 4 to 128 tokens, fp32, 2 CPU cores:
      forward + backward 30.1 s per-row, 23.9 s with the prompts shared, 17.2 s with buckets.

What is not covered:
    * Models with gradient checkpointing on in training mode: transformers turns the cache off
      there, so they take the plain per-row forward.
    * Prefix sharing between prompts that differ (only identical prompts are merged).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from transformers import DynamicCache

from ibpo_lit.algorithms.logprobs import token_logprobs
from ibpo_lit.rollout.batch import RolloutBatch

BUCKET_OVERHEAD_TOKENS = 32
"""What one more forward/backward pass costs, in padded response tokens (a pass streams every
weight again); sets how finely rows are split by response length (see ``_length_buckets``)."""


def response_logprobs(model: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0) -> Tensor:
    """Teacher-forced ``log pi(y_t | x, y_<t)`` for every response position.

    Returns [B, Lr] float32; values at padding are meaningless and must be masked by the
    caller with ``batch.response_mask``.

    Prompts are left-padded, so ``position_ids`` come from the attention mask (each row
    starts at 0). Only response positions get logits: the prompt's logits are never used,
    and on a 49k-token vocabulary the head is a large share of the forward pass. Rows that
    share a prompt share its forward (see the module docstring).
    """
    if len(batch) < 2 or batch.response_ids.shape[1] < 2 or getattr(model, "is_gradient_checkpointing", False):
        return _per_row_logprobs(model, batch, temperature)
    return _shared_prompt_logprobs(model, batch, temperature, *_distinct_prompts(batch))


def _per_row_logprobs(model: torch.nn.Module, batch: RolloutBatch, temperature: float) -> Tensor:
    """One forward of every row's prompt + response."""
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
    attention_mask = torch.cat([batch.prompt_mask, batch.response_mask], dim=1).long()
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    lr = batch.response_ids.shape[1]
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        logits_to_keep=lr + 1,
    )
    logits = out.logits[:, :-1]  # position Lp-1+t predicts response token t
    return token_logprobs(logits, batch.response_ids, temperature)


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
    model: torch.nn.Module, batch: RolloutBatch, temperature: float, first: Tensor, inverse: Tensor
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
        past_key_values=DynamicCache(config=model.config),
        use_cache=True,
        logits_to_keep=1,
    )
    prompt_cache = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    response_ids = batch.response_ids
    logp = torch.zeros(response_ids.shape, dtype=torch.float32, device=response_ids.device)  # [B, Lr]
    # The last prompt position predicts response token 0.
    logp[:, 0] = token_logprobs(out.logits[:, -1][inverse], response_ids[:, 0], temperature)
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
        out = model(
            input_ids=inputs,
            attention_mask=torch.cat([row_prompt_mask, batch.response_mask[rows, : n - 1].long()], dim=1),
            position_ids=row_prompt_mask.sum(dim=1, keepdim=True) + steps,  # [rows, n - 1]
            past_key_values=cache,
            use_cache=True,
        )
        logp[rows, 1:n] = token_logprobs(out.logits, response_ids[rows, 1:n], temperature)
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
