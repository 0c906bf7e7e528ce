"""Per-token log-probabilities of chosen tokens: the one place both the sampler and the
trainer turn logits into ``log pi(y_t)``, so that the two can only disagree by numerics."""
from __future__ import annotations

import torch
from torch import Tensor


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / temperature)`` at ``tokens``.

    Args:
        logits: [..., V] unnormalised scores (any float dtype; computed in float32).
        tokens: [...] long, the chosen token at each position.
        temperature: The sampling temperature; the trained policy is the sampled one.

    Returns:
        [...] float32 log-probs.

    ``logsumexp`` minus the gathered logit avoids materialising a second [..., V] tensor
    as ``log_softmax(...).gather(...)`` would.
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)
