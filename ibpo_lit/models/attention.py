"""Which attention implementations keep packed rows apart, and when ``rollout.packing`` packs.

The one rule the trainer (``training/packing.py``) and the plan (``plan/memory.py``) share; it
lives here, in ``models/``, because the plan may not import ``training/``
(docs/architecture.md). Names are transformers' ``config._attn_implementation`` values.
"""
from __future__ import annotations

from typing import Optional

# Attention implementations that transformers keeps within each packed row (see above).
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
BLOCK_ATTENTION = ("flex_attention",)
DENSE_ATTENTION = ("sdpa", "eager")


ATTENTION_SETTINGS = DENSE_ATTENTION + BLOCK_ATTENTION + VARLEN_ATTENTION
"""What ``model.attn_implementation`` takes: the implementations whose packing rule is known
(a custom or paged kernel might attend across packed rows)."""


def check_attn_implementation(name: Optional[str]) -> None:
    """A clear error for a ``model.attn_implementation`` outside `ATTENTION_SETTINGS`. Whether
    the kernel is installed (flash-attn) transformers checks when the model loads."""
    if name is not None and name not in ATTENTION_SETTINGS:
        raise ValueError(f"model.attn_implementation must be one of {', '.join(ATTENTION_SETTINGS)} or unset "
                         f"(the model's default, SDPA), got {name!r}")


def attention_kind(implementation: Optional[str]) -> Optional[str]:
    """``"varlen"`` (flash-attention), ``"block"`` (flex attention's block mask), ``"dense"``
    (SDPA, eager: an N x N mask) or None (attention that would cross packed rows) for an
    attention implementation's name (``config._attn_implementation``)."""
    for kind, names in (("varlen", VARLEN_ATTENTION), ("block", BLOCK_ATTENTION), ("dense", DENSE_ATTENTION)):
        if implementation in names:
            return kind
    return None


def packs_under(packing: str, kind: Optional[str]) -> bool:
    """Whether ``rollout.packing`` packs under attention of ``kind`` (`attention_kind`): ``on``
    under any kind that keeps rows apart, ``auto`` where the kernel skips the other rows."""
    if packing == "auto":
        return kind in ("varlen", "block")
    return packing == "on" and kind is not None
