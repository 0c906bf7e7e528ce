"""A prompt as the data room hands it to the training step."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Prompt:
    prompt_ids: list[int]  # chat-templated, tokenized prompt (generation prompt included)
    problem: str  # the problem text alone, as correction prompts quote it (a conversation's text form)
    gold: str | None  # gold answer, as the verifier expects it; None: the record has none (a reward of your own)
    task: str = "math"  # which verifier scores it
    uid: str = ""  # stable id: "<file>:<line>" or "arithmetic:<index>"
    meta: dict = field(default_factory=dict)
    # The record's other fields (e.g. ``answer``, ``level``), as read: what a reward function
    # receives as keyword arguments (TRL's convention, `ibpo_lit.rewards`).
    columns: dict = field(default_factory=dict)


def collate_prompts(items: list[Prompt]) -> list[Prompt]:
    """DataLoader collate: a step's prompts stay a plain list (no tensors to stack)."""
    return list(items)
