"""The trainer's forward pass: log-probs of a rollout batch's response tokens."""
from __future__ import annotations

import torch
from torch import Tensor

from ibpo_lit.algorithms.logprobs import token_logprobs
from ibpo_lit.rollout.batch import RolloutBatch


def response_logprobs(model: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0) -> Tensor:
    """Teacher-forced ``log pi(y_t | x, y_<t)`` for every response position.

    Returns [B, Lr] float32; values at padding are meaningless and must be masked by the
    caller with ``batch.response_mask``.

    Prompts are left-padded, so ``position_ids`` come from the attention mask (each row
    starts at 0). Only the ``Lr + 1`` last positions' logits are computed: the prompt's
    logits are never used, and on a 49k-token vocabulary the head is a large share of
    the forward pass.
    """
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
