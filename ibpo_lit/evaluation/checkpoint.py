"""Policy weights from a Lightning checkpoint written by ``IBPOModule``, for evaluation.

The reading lives in `ibpo_lit.models.export` (one reader for evaluate and export): a single
file or a sharded checkpoint's folder, LoRA adapters merged, and a mismatch raises a
``ValueError`` naming missing and unexpected keys and the model the checkpoint was trained from
(its ``hyper_parameters["model"]``), so the user knows which ``model`` to pass.

Safety: a Lightning checkpoint pickles its hyperparameters (our config dataclasses), so it is
read with ``torch.load(weights_only=False)``. Only evaluate checkpoints you trust.
"""
from __future__ import annotations

import torch

from ibpo_lit.models.export import POLICY_PREFIX, load_trained_weights, policy_state_dict, read_checkpoint

__all__ = ["POLICY_PREFIX", "load_checkpoint_weights", "policy_state_dict", "read_checkpoint"]


def load_checkpoint_weights(model: torch.nn.Module, ckpt_path: str) -> torch.nn.Module:
    """Load the trained policy of ``ckpt_path`` into ``model`` (strict; in place, LoRA merged in)."""
    return load_trained_weights(model, read_checkpoint(ckpt_path), ckpt_path)
