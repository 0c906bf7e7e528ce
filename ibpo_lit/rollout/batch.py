"""The rollout batch: one dataclass that every stage of a training step reads or extends.

Shapes use ``B`` for responses (prompts x samples), ``Lp`` for the padded prompt length and
``Lr`` for the padded response length. Prompts are left-padded and responses right-padded,
so ``cat([prompt_ids, response_ids], dim=1)`` is a batch of contiguous sequences whose
response tokens all start at column ``Lp`` (the layout verl uses).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional, Sequence

import torch
from torch import Tensor


@dataclass
class RolloutBatch:
    prompt_ids: Tensor  # [B, Lp] long, left-padded with the pad id
    prompt_mask: Tensor  # [B, Lp] bool, True on real prompt tokens
    response_ids: Tensor  # [B, Lr] long, right-padded with the pad id
    response_mask: Tensor  # [B, Lr] bool, True on generated tokens (the closing EOS included)
    rollout_logp: Tensor  # [B, Lr] float32, log-prob of each sampled token under the engine's
    #                       sampling distribution, 0 on padding: the HF engine's is log_softmax(
    #                       logits / T) before any filter; vLLM's is after its penalty and
    #                       top-k/top-p/min-p (see rollout/vllm_engine.py). Equal with no filter.
    group_index: Tensor  # [B] long, the prompt (0..P-1) each response answers
    seeds: Tensor  # [B] long, the per-rollout sampling seed
    finished: Tensor  # [B] bool, True when the response ended with EOS (not cut at max length)
    tool_mask: Optional[Tensor] = None  # [B, Lr] bool, True on tool-output tokens (tool-integrated
    #                       rollouts: rollout/tools.py): in the sequence, not sampled, so out of the
    #                       loss and the importance ratio (``policy_mask``); rollout_logp 0 there.
    #                       None at construction: all False.

    def __post_init__(self) -> None:
        if self.tool_mask is None:
            self.tool_mask = torch.zeros_like(self.response_mask)

    @property
    def policy_mask(self) -> Tensor:  # [B, Lr] bool
        """The tokens the policy sampled: the response without its tool turns (what is trained)."""
        return self.response_mask & ~self.tool_mask

    @staticmethod
    def from_lists(
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        logps: Sequence[Sequence[float]],
        finished: Sequence[bool],
        seeds: Sequence[int],
        group_index: Sequence[int],
        pad_token_id: int,
        tool_masks: Optional[Sequence[Sequence[bool]]] = None,
    ) -> "RolloutBatch":
        """A batch from unpadded per-row lists (what engines outside torch, like vLLM, return);
        ``tool_masks``: per row, True on each tool-output token (None: none)."""
        rows = len(responses)
        lp = max((len(p) for p in prompts), default=0)
        lr = max((len(r) for r in responses), default=0)
        prompt_ids = torch.full((rows, lp), pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros((rows, lp), dtype=torch.bool)
        response_ids = torch.full((rows, lr), pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((rows, lr), dtype=torch.bool)
        rollout_logp = torch.zeros((rows, lr), dtype=torch.float32)
        tool_mask = torch.zeros((rows, lr), dtype=torch.bool)
        for b, tools in enumerate(tool_masks or ()):
            if len(tools) != len(responses[b]):
                raise ValueError(f"row {b}: {len(responses[b])} response tokens but {len(tools)} tool flags")
            tool_mask[b, : len(tools)] = torch.as_tensor(list(tools), dtype=torch.bool)
        for b, (prompt, response, logp) in enumerate(zip(prompts, responses, logps)):
            if len(logp) != len(response):
                raise ValueError(f"row {b}: {len(response)} response tokens but {len(logp)} log-probs")
            prompt_ids[b, lp - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
            prompt_mask[b, lp - len(prompt) :] = True
            response_ids[b, : len(response)] = torch.as_tensor(list(response), dtype=torch.long)
            response_mask[b, : len(response)] = True
            rollout_logp[b, : len(logp)] = torch.as_tensor(list(logp), dtype=torch.float32)
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=response_mask,
            rollout_logp=rollout_logp,
            group_index=torch.as_tensor(list(group_index), dtype=torch.long),
            seeds=torch.as_tensor(list(seeds), dtype=torch.long),
            finished=torch.as_tensor(list(finished), dtype=torch.bool),
            tool_mask=tool_mask,
        )

    @staticmethod
    def empty(pad_token_id: int = 0) -> "RolloutBatch":
        """A batch of no rows (``generate`` with no prompts)."""
        return RolloutBatch.from_lists([], [], [], [], [], [], pad_token_id)

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def response_lengths(self) -> Tensor:  # [B] long
        return self.response_mask.sum(dim=1)

    def response_lists(self) -> list[list[int]]:
        """Unpadded response token ids, one list per row."""
        return [row[m].tolist() for row, m in zip(self.response_ids, self.response_mask)]

    def prompt_lists(self) -> list[list[int]]:
        """Unpadded prompt token ids, one list per row."""
        return [row[m].tolist() for row, m in zip(self.prompt_ids, self.prompt_mask)]

    def select(self, index: Tensor | Sequence[int]) -> "RolloutBatch":
        """Rows ``index`` (a list, a long tensor or a bool mask), trimmed to their own padding."""
        index = torch.as_tensor(index)
        picked = replace(self, **{f.name: getattr(self, f.name)[index] for f in fields(self)})
        return picked.trimmed()

    def trimmed(self) -> "RolloutBatch":
        """Drop padding columns that no row uses (left for prompts, right for responses)."""
        lp = int(self.prompt_mask.sum(dim=1).max()) if len(self) else 0
        lr = int(self.response_mask.sum(dim=1).max()) if len(self) else 0
        lp_total = self.prompt_ids.shape[1]
        return replace(
            self,
            prompt_ids=self.prompt_ids[:, lp_total - lp :],
            prompt_mask=self.prompt_mask[:, lp_total - lp :],
            response_ids=self.response_ids[:, :lr],
            response_mask=self.response_mask[:, :lr],
            rollout_logp=self.rollout_logp[:, :lr],
            tool_mask=self.tool_mask[:, :lr],
        )

    def to(self, device: torch.device | str) -> "RolloutBatch":
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @staticmethod
    def concat(batches: Sequence["RolloutBatch"], pad_token_id: int) -> "RolloutBatch":
        """Stack batches row-wise, re-padding to the longest prompt and response.

        ``group_index`` values are kept as they are: offset them first when groups of the
        different batches must stay apart.
        """
        if not batches:
            raise ValueError("RolloutBatch.concat needs at least one batch")
        lp = max(b.prompt_ids.shape[1] for b in batches)
        lr = max(b.response_ids.shape[1] for b in batches)

        def left(t: Tensor, width: int, value) -> Tensor:
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

        def right(t: Tensor, width: int, value) -> Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        return RolloutBatch(
            prompt_ids=torch.cat([left(b.prompt_ids, lp, pad_token_id) for b in batches]),
            prompt_mask=torch.cat([left(b.prompt_mask, lp, False) for b in batches]),
            response_ids=torch.cat([right(b.response_ids, lr, pad_token_id) for b in batches]),
            response_mask=torch.cat([right(b.response_mask, lr, False) for b in batches]),
            rollout_logp=torch.cat([right(b.rollout_logp, lr, 0.0) for b in batches]),
            group_index=torch.cat([b.group_index for b in batches]),
            seeds=torch.cat([b.seeds for b in batches]),
            finished=torch.cat([b.finished for b in batches]),
            tool_mask=torch.cat([right(b.tool_mask, lr, False) for b in batches]),
        )
