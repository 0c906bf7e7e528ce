"""The testbed's task: ``P`` prompts, sequences of ``T`` tokens from ``V``, a terminal 0/1 reward.

Prompt ``x`` has a hidden target ``t_x`` (``T`` tokens drawn from the problem's seed) and a
threshold ``m_x``; a response ``y`` is right when it matches the target on at least ``m_x``
positions: ``r(x, y) = 1[sum_t 1[y_t = t_x,t] >= m_x]``. Thresholds cycle over
``m - 1, m, m + 1`` (``m`` = ``threshold``, default ``round(0.75 T)``), so the prompts differ in
difficulty and group normalisation across prompts matters (T = 8, V = 2 at the uniform
policy: 0.36, 0.145 and 0.035 of the sequences are right).

Prefix tree: the policy's decision at position ``t`` depends on the prompt and the prefix
``y_<t``; a prefix of length ``t`` is the base-``V`` number ``code_t = sum_u y_u V^(t-1-u)`` and
its *state* is ``offset_t + code_t`` with ``offset_t = sum_{u<t} V^u``: ``S = sum_{t<T} V^t``
states per prompt, which a table of ``[P, S, V]`` log-probs covers exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor


@dataclass(frozen=True)
class Problem:
    """Prompts, targets and thresholds.

    Args:
        num_prompts: P.
        length: T, tokens per response.
        vocab: V, tokens per decision.
        threshold: m, matches needed (prompts cycle over m - 1, m, m + 1, clamped to [1, T]);
            None = ``round(0.75 * T)``.
        seed: draws the targets.
    """

    num_prompts: int = 8
    length: int = 8
    vocab: int = 2
    threshold: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_prompts < 1 or self.length < 1 or self.vocab < 2:
            raise ValueError(f"need num_prompts >= 1, length >= 1, vocab >= 2; got {self}")
        if self.vocab ** self.length > 2 ** 16:
            raise ValueError(f"V^T = {self.vocab ** self.length} sequences is too many to enumerate (max 2^16)")

    @cached_property
    def targets(self) -> Tensor:
        """[P, T] long, each prompt's hidden target."""
        g = torch.Generator().manual_seed(1000 + self.seed)
        return torch.randint(self.vocab, (self.num_prompts, self.length), generator=g)

    @cached_property
    def thresholds(self) -> Tensor:
        """[P] long, matches each prompt's responses need."""
        m = round(0.75 * self.length) if self.threshold is None else self.threshold
        cycle = torch.tensor([m - 1, m, m + 1])[torch.arange(self.num_prompts) % 3]
        return cycle.clamp(1, self.length)

    def reward(self, prompts: Tensor, seqs: Tensor) -> Tensor:
        """[N] float 0/1 rewards of ``seqs`` [N, T] answering ``prompts`` [N]."""
        matches = (seqs == self.targets[prompts]).sum(-1)
        return (matches >= self.thresholds[prompts]).to(torch.float64)

    def errors(self, prompts: Tensor, seqs: Tensor) -> Tensor:
        """[N, T] bool, positions where ``seqs`` differ from their prompt's target."""
        return seqs != self.targets[prompts]

    # ------------------------------------------------------------------ prefix tree
    @cached_property
    def offsets(self) -> Tensor:
        """[T] long, first state of each position: ``sum_{u<t} V^u``."""
        sizes = self.vocab ** torch.arange(self.length)
        return torch.cumsum(sizes, 0) - sizes

    @property
    def num_states(self) -> int:
        """S, the prefixes of length 0..T-1."""
        return int(self.offsets[-1]) + self.vocab ** (self.length - 1)

    def states(self, seqs: Tensor) -> Tensor:
        """[N, T] long, the state (prefix) each token of ``seqs`` [N, T] is drawn from."""
        code = torch.zeros(seqs.shape[0], dtype=torch.long)
        out = torch.empty_like(seqs)
        for t in range(self.length):
            out[:, t] = self.offsets[t] + code
            code = code * self.vocab + seqs[:, t]
        return out

    @cached_property
    def state_prefixes(self) -> Tensor:
        """[S, T] long, the prefix of every state: its tokens, -1 where no token is yet."""
        rows = []
        for t in range(self.length):
            n = self.vocab ** t
            digits = torch.full((n, self.length), -1, dtype=torch.long)
            codes = torch.arange(n)
            for u in range(t):  # code = sum_u y_u V^(t-1-u)
                digits[:, u] = (codes // self.vocab ** (t - 1 - u)) % self.vocab
            rows.append(digits)
        return torch.cat(rows)

    @cached_property
    def state_positions(self) -> Tensor:
        """[S] long, the position each state decides."""
        return torch.repeat_interleave(torch.arange(self.length), self.vocab ** torch.arange(self.length))

    @cached_property
    def all_sequences(self) -> Tensor:
        """[V^T, T] long, every response in base-V order."""
        n = self.vocab ** self.length
        codes = torch.arange(n)
        return torch.stack([(codes // self.vocab ** (self.length - 1 - t)) % self.vocab for t in range(self.length)], 1)

    @cached_property
    def all_rewards(self) -> Tensor:
        """[P, V^T] float64, the reward of every response to every prompt."""
        seqs = self.all_sequences
        return torch.stack([self.reward(torch.full((len(seqs),), x), seqs) for x in range(self.num_prompts)])
