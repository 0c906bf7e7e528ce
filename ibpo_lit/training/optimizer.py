"""AdamW with linear warm-up and cosine decay (METHOD section 7), over the trainable parameters."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ibpo_lit.algorithms.schedule import warmup_cosine
from ibpo_lit.config import OptimConfig


def build_optimizer(policy: torch.nn.Module, cfg: OptimConfig, max_steps: int) -> dict:
    """Lightning's ``configure_optimizers`` answer: AdamW and its per-step schedule.

    ``max_steps``: ``trainer.max_steps`` (-1 when unset), the schedule's length unless
    ``optim.total_steps`` is set.
    """
    total = cfg.total_steps or (max_steps if max_steps > 0 else None)
    if total is None:
        raise ValueError(
            "set trainer.max_steps (or optim.total_steps): the cosine schedule needs the number of optimizer steps"
        )
    warmup = int(round(cfg.warmup_ratio * total))
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
        fused=use_fused_adamw(params, cfg.fused),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_cosine(step, total, warmup, cfg.min_lr_ratio))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def use_fused_adamw(params: list[Tensor], requested: Optional[bool]) -> bool:
    """Whether AdamW runs its fused kernel: ``requested`` when set, else on when every
    parameter is a plain floating tensor on CPU or CUDA. DTensor shards (FSDP2) stay on the
    default kernel unless asked for: torch's fused support for them varies by version.
    Asking for the kernel on a device or dtype it does not support is an error here, with
    the reason, rather than deep inside the first ``optimizer.step``."""
    from torch.distributed.tensor import DTensor

    unsupported = next(
        (f"{p.dtype} parameter on {p.device.type}" for p in params
         if p.device.type not in ("cpu", "cuda") or not p.is_floating_point()),
        None,
    )
    if requested and unsupported:
        raise ValueError(f"optim.fused=true, but torch's fused AdamW does not support a {unsupported}; unset it")
    if requested is not None:
        return requested
    return unsupported is None and not any(isinstance(p, DTensor) for p in params)
