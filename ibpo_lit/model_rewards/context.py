"""`ModelRewardContext`: what a reward scored by a model needs from the run, handed to it once.

The module builds one (``IBPOModule``'s reward construction) and the reward keeps it: the device
the policy trains on, the collectives of the run, the FSDP2 plan when the policy is sharded, the
weights' version (named when a time limit passes), and, for a judge that is the policy itself,
the rollout engine's ``generate`` and the policy's tokenizer. A reward never reaches back into
the module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ibpo_lit.scale.collectives import SINGLE_PROCESS, RankSync
from ibpo_lit.scale.fsdp2 import FSDP2Plan


@dataclass
class ModelRewardContext:
    """What a model-scored reward (``reward_model:``, ``judge:``) gets from the trainer.

    Args:
        device: Where its model runs: the policy's device (the trainer's root device).
        sync: The run's collectives (`RankSync`; a no-op in one process). Under FSDP2 a sharded
            forward is a collective, so scoring agrees on the number of forwards through it.
        plan: The policy's FSDP2 plan when the run shards it (None: one full copy per process);
            a reward model (and a judge's own model) is sharded the same way.
        dtype: Weights' dtype when loading (``model.dtype``), unless the reward's options say.
        batch_size: ``model.reward_batch_size``: responses per forward of a reward model.
        tokenizer: The policy's tokenizer (a judge that is the policy encodes with it).
        generate: The rollout engine's ``generate(prompt_ids, n, seeds, sampling)`` (a judge
            that is the policy asks through it); every rank calls it equally often.
        context_limit: Longest prompt + reply the rollout engine takes (None: unknown).
        seed: The run's rollout seed (a judge's seeds derive from it and the prompt's text).
        weights_version: The policy's weights' version now (optimizer steps taken), named when a
            scoring call passes its time limit.
    """

    device: torch.device = torch.device("cpu")
    sync: RankSync = SINGLE_PROCESS
    plan: Optional[FSDP2Plan] = None
    dtype: str = "float32"
    batch_size: Optional[int] = None
    tokenizer: Any = None
    generate: Optional[Callable[..., Any]] = None
    context_limit: Optional[int] = None
    seed: int = 0
    weights_version: Callable[[], Optional[int]] = lambda: None
