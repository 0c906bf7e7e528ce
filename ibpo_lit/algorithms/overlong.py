"""Long responses: DAPO's soft overlong punishment (its eq. 13), as verl's ``overlong_buffer``.

With ``L_max`` the longest response (``rollout.sampling.max_new_tokens``) and a buffer of
``L_cache`` tokens before it, a response of ``L`` tokens gets

    0                                      if L <= L_max - L_cache
    -factor * (L - (L_max - L_cache)) / L_cache   if L_max - L_cache < L <= L_max
    -factor                                if L > L_max

added to its reward: a ramp instead of the cliff of a truncated answer scoring 0. The other
switch, masking truncated responses out of the loss (TRL's ``mask_truncated_completions``), is
not a formula: ``training/assemble.py`` applies it.
"""
from __future__ import annotations

import torch
from torch import Tensor


def soft_overlong_penalty(lengths: Tensor, max_length: int, buffer: int, factor: float = 1.0) -> Tensor:
    """[B] float32 penalties (<= 0) for responses of ``lengths`` [B] tokens."""
    if buffer < 1 or buffer > max_length:
        raise ValueError(f"the overlong buffer must be in [1, max_length={max_length}], got {buffer}")
    if factor < 0:
        raise ValueError(f"the overlong penalty factor must be >= 0, got {factor}")
    over = (lengths.float() - (max_length - buffer)).clamp(min=0.0)
    return -factor * torch.clamp(over / buffer, max=1.0)
