"""Per-token quantities from logits: ``log pi(y_t)`` of the chosen tokens (the one place both the
sampler and the trainer compute it, so that the two can only disagree by numerics), and the
entropy of the sampling distribution at each position."""
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


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of ``softmax(logits / temperature)`` at each position, in nats.

    Args:
        logits: [..., V] unnormalised scores (computed in float32).
        temperature: The sampling temperature (the entropy of the distribution sampled from).

    Returns:
        [...] float32, ``logsumexp(z) - sum(softmax(z) * z)`` with ``z = logits / temperature``
        (equal to ``-sum p log p``, without a log of a probability that underflows to 0).
    """
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    return (lse.squeeze(-1) - (torch.exp(z - lse) * z).sum(dim=-1))
