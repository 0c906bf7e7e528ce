"""Learning-rate multiplier: linear warm-up, then cosine decay to a floor (METHOD section 7:
warm-up over 3% of steps, cosine decay to 0.1x).

Kept here rather than transformers' ``get_cosine_with_min_lr_schedule_with_warmup`` (4.56 to
5.x): that one's decay is one step ahead (``progress = (step - warmup + 1) / decay``: the first
step after warm-up is already below the peak), and past ``total_steps`` it follows the cosine
back up instead of holding the floor, which a resumed run given a longer ``trainer.max_steps``
would feel. Using it would change the schedule every checkpoint was trained with.
"""
from __future__ import annotations

import math


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_ratio: float = 0.1) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    Warm-up is linear from ``1/warmup_steps`` (step 0 already moves, as in verl) to 1 at
    ``warmup_steps``; then cosine from 1 down to ``min_ratio`` at ``total_steps``; held at
    ``min_ratio`` past the end.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
