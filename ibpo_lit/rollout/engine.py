"""What a rollout engine is: prompts (token ids) in, a ``RolloutBatch`` out.

Engines know models and samplers; they know nothing of rewards or losses.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal, Sequence

from ibpo_lit.rollout.batch import RolloutBatch


HFDecode = Literal["dynamic", "static"]
"""The HF engine's decodes (``rollout.hf_decode``, ``HFRolloutEngine(decode=...)``): here, beside
the engines' contract, which the config and the HF engine both import (the factory cannot be
that home: it imports the HF engine, lazily, to build it)."""


@dataclass
class SamplingConfig:
    """Decoding settings for one generation call.

    Args:
        temperature: Softmax temperature (> 0). Log-probs returned and trained on use the same
            temperature, as verl and TRL do.
        top_p: Nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: Keep the k most likely tokens; 0 disables it.
        min_p: Drop tokens whose probability is below ``min_p`` times the top token's; 0 disables it.
        max_new_tokens: Longest response, in tokens; a response cut here is marked unfinished.
        repetition_penalty: vLLM's and transformers' repetition penalty (> 0): every token
            already in the prompt or the response so far has its logit divided by it when
            positive and multiplied by it when negative, before the temperature. Above 1
            discourages repeats, below 1 encourages them; 1 turns it off. Like the filters, it
            changes only how tokens are drawn: the log-probs returned and trained on stay the
            model's own ``softmax(logits / temperature)``, without the penalty (as verl and TRL
            train), so with a penalty the rollouts are drawn slightly off the trained policy.
        stop: Stop strings: a response ends once its text (this call's tokens, decoded) contains
            one, the string kept in it (vLLM's ``stop`` with ``include_stop_str_in_output``); the
            response counts as finished. Empty: only EOS and the length end a response.
            Tool-integrated rollouts (``rollout.tools``) add their cell's closing text here.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_new_tokens: int = 256
    repetition_penalty: float = 1.0  # callers build the fields above positionally
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"sampling.min_p must be in [0, 1), got {self.min_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self.stop = tuple(self.stop)
        if any(not isinstance(x, str) or not x for x in self.stop):
            raise ValueError(f"sampling.stop must be non-empty strings, got {self.stop!r}")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"sampling.repetition_penalty must be a finite number > 0 (1 = off), "
                             f"got {self.repetition_penalty}")


def check_generate_args(prompts: Sequence[Sequence[int]], n: int, seeds: Sequence[int]) -> None:
    """What every engine's ``generate`` requires of its arguments (ValueError otherwise)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if len(seeds) != len(prompts) * n:
        raise ValueError(f"need one seed per response: {len(prompts)} prompts x n={n} "
                         f"= {len(prompts) * n}, got {len(seeds)}")


class RolloutEngine(ABC):
    """Samples responses from the current policy."""

    @abstractmethod
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        seeds: Sequence[int],
        sampling: SamplingConfig | None = None,
    ) -> RolloutBatch:
        """Sample ``n`` responses for each prompt.

        Every rank of a multi-process run calls ``generate`` at the same points of a step, with
        no prompts at all where it has none: under FSDP2 (HF engine) and vLLM tensor
        parallelism a call is a collective.

        Args:
            prompts: P prompts as unpadded token-id lists (P may be 0: an empty batch).
            n: Samples per prompt.
            seeds: One seed per response (length P * n). The same prompt, seed and weights
                give the same response, whatever else is in the batch.
            sampling: Overrides the engine's default decoding settings for this call.

        Returns:
            A batch of B = P * n rows, prompt-major: row ``p * n + j`` is sample ``j`` of
            prompt ``p`` and has ``group_index == p``.
        """

    def sync_weights(self, named_tensors) -> None:  # noqa: B027 - optional hook
        """Load new policy weights. Engines that share the trainer's model need nothing."""

    @property
    def context_limit(self) -> int | None:
        """Longest prompt + response the engine itself takes (None: no limit beyond the model's)."""
        return None
