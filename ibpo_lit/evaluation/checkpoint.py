"""Policy weights from a Lightning checkpoint written by ``IBPOModule``.

What is covered:
- ``policy_state_dict``: the ``state_dict`` entries under ``policy.``, prefix stripped;
  ``ref_policy.`` (the frozen KL reference) and anything else is ignored.
- ``load_checkpoint_weights``: loads them into a model strictly; a mismatch raises a
  ``ValueError`` naming missing and unexpected keys and the model the checkpoint was trained
  from (its ``hyper_parameters["model"]``), so the user knows which ``model`` to pass.

What is not covered:
- Sharded (FSDP/DeepSpeed) checkpoint directories: consolidate to one file first.
- Safety: a Lightning checkpoint pickles its hyperparameters (our config dataclasses), so it is
  read with ``torch.load(weights_only=False)``. Only evaluate checkpoints you trust.
"""
from __future__ import annotations

import os

import torch

POLICY_PREFIX = "policy."


def read_checkpoint(ckpt_path: str) -> dict:
    """The checkpoint dict of ``ckpt_path`` on the CPU."""
    if not os.path.isfile(ckpt_path):
        raise FileNotFoundError(f"no checkpoint file {ckpt_path!r} (e.g. <default_root_dir>/checkpoints/last.ckpt)")
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"{ckpt_path!r} is not a Lightning checkpoint: no 'state_dict' entry")
    return ckpt


def policy_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of ``state_dict`` under ``policy.``, with that prefix removed."""
    return {key[len(POLICY_PREFIX):]: value for key, value in state_dict.items() if key.startswith(POLICY_PREFIX)}


def load_checkpoint_weights(model: torch.nn.Module, ckpt_path: str) -> None:
    """Load the trained policy of ``ckpt_path`` into ``model`` (in place, strict)."""
    ckpt = read_checkpoint(ckpt_path)
    weights = policy_state_dict(ckpt["state_dict"])
    trained_from = (ckpt.get("hyper_parameters") or {}).get("model", "unknown")
    if not weights:
        raise ValueError(f"{ckpt_path!r} has no '{POLICY_PREFIX}*' weights; was it written by IBPOModule?")
    missing, unexpected = _key_mismatch(model, weights)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {ckpt_path!r} does not fit the model: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{' ...' if len(unexpected) > 5 else ''}; it was trained from model {trained_from!r}, pass that"
        )
    model.load_state_dict(weights, strict=True)


def _key_mismatch(model: torch.nn.Module, weights: dict) -> tuple[list[str], list[str]]:
    expected = set(model.state_dict())
    return sorted(expected - set(weights)), sorted(set(weights) - expected)
