"""Rollouts sampled from the trained Hugging Face model itself, with our own decoding loop.

What is covered:
    * ``HFRolloutEngine`` samples from the very model object the trainer optimises (no copy, so
      no weight sync), in eval mode and without gradients, restoring the training flag after.
    * Left-padded prompts, a KV cache, per-row ``position_ids``, stop at any EOS id (the EOS is
      part of the response), ``max_new_tokens`` cut-off (such rows are ``finished=False``).
    * Temperature, top-k, top-p and min-p through transformers' logits warpers, and a
      repetition penalty through its ``RepetitionPenaltyLogitsProcessor`` (on the raw logits,
      before the temperature, as ``generate`` and vLLM apply it), over each row's own prompt
      and response tokens only: its left padding never counts (see ``_penalty_history``), so a
      row's tokens still depend only on (prompt, seed, weights).
    * Per-rollout seeds: row ``b`` draws its sampling uniforms from its own ``torch.Generator``
      seeded with ``seeds[b]``, so its tokens depend only on (prompt, seed, weights).
    * ``rollout_logp``: log-prob of each sampled token under ``softmax(logits / temperature)``
      before the repetition penalty and top-k/top-p/min-p filtering, through ``token_logprobs``
      (the trainer's function): the model's own distribution, the one the trainer trains.
    * No work twice: each distinct prompt is prefilled once and its KV cache indexed out to its
      ``n`` rows; a row that ends leaves the batch (its cache rows are dropped), so the
      decode steps after it cost nothing for it (what that saves: docs/benchmarks.md).

    * A policy sharded with FSDP2: its weights are gathered for the whole call
      (``ibpo_lit.scale.fsdp2.gathered_weights``), so each decoding step runs without
      collectives and ranks may decode different numbers of steps. Every rank must call
      ``generate`` equally often (with no prompts where it has none): entering is a
      collective. It needs one full copy of the weights per rank while it decodes.

What is not covered:
    * Speed beyond that: one process, one batch, no continuous batching or paged attention.
      Use it for tests, small models and as the reference the faster engines are checked
      against.
    * Bit-exact reproducibility across batch compositions is as good as the kernels: a row's
      logits can differ in the last float bits between batch shapes, which flips a sampled
      token only if the row's uniform falls within that error of a CDF boundary.

Why not ``model.generate``: it samples every row from one global RNG, so a response depends on
which other rows share its batch and in what order; and it returns scores only after all
processors, not the log-prob of each sampled token under the temperature-scaled policy. Our
loop gives each row its own generator and computes the log-probs in the same pass.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ibpo_lit.algorithms.logprobs import token_logprobs
from ibpo_lit.models.compile import eager
from ibpo_lit.models.hf_compat import cache_kwargs, output_cache
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.rollout.engine import RolloutEngine, SamplingConfig, check_generate_args
from ibpo_lit.scale.fsdp2 import gathered_weights


class HFRolloutEngine(RolloutEngine):
    """Sample with a Hugging Face causal LM's forward and KV cache.

    Args:
        model: The policy; the same object the trainer trains.
        eos_token_ids: Any of these ends a response (and is kept in it).
        pad_token_id: Fills prompt (left) and response (right) padding.
        sampling: Default decoding settings; ``generate`` may override them per call.
        max_batch_size: Decode at most this many rows at once (bounds the KV cache);
            None decodes all P * n rows together. Results do not depend on it.
        reshard_after_forward: For a model sharded with FSDP2: its decoder layers' setting,
            restored after each call (see ``gathered_weights``).
        tokenizer: Decodes responses for ``SamplingConfig.stop`` (needed only with stop strings).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        sampling: SamplingConfig,
        max_batch_size: int | None = None,
        reshard_after_forward: bool = True,
        tokenizer=None,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("HFRolloutEngine needs at least one eos_token_id")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        self.model = model
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.pad_token_id = int(pad_token_id)
        self.sampling = sampling
        self.max_batch_size = max_batch_size
        self.reshard_after_forward = reshard_after_forward
        self.tokenizer = tokenizer

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        seeds: Sequence[int],
        sampling: SamplingConfig | None = None,
    ) -> RolloutBatch:
        sampling = sampling or self.sampling
        check_generate_args(prompts, n, seeds)
        if sampling.stop and self.tokenizer is None:
            raise ValueError("stop strings (sampling.stop) need the engine's tokenizer: HFRolloutEngine(tokenizer=...)")
        rows = [list(p) for p in prompts for _ in range(n)]  # prompt-major
        seeds = [int(s) for s in seeds]
        chunk = self.max_batch_size or max(len(rows), 1)
        was_training = self.model.training
        self.model.eval()
        try:
            # eager(): layers compiled for training (model.torch_compile) would recompile at every
            # new cache length here
            with torch.no_grad(), eager(), gathered_weights(self.model, self.reshard_after_forward):
                parts = [
                    self._generate_rows(rows[i : i + chunk], seeds[i : i + chunk], sampling)
                    for i in range(0, len(rows), chunk)
                ]
        finally:
            self.model.train(was_training)
        if not parts:
            return RolloutBatch.empty(self.pad_token_id)
        batch = parts[0] if len(parts) == 1 else RolloutBatch.concat(parts, self.pad_token_id)
        prompt_index = torch.arange(len(prompts), device=batch.seeds.device)
        batch.group_index = prompt_index.repeat_interleave(n)
        return batch

    def _generate_rows(
        self, prompts: list[list[int]], seeds: list[int], sampling: SamplingConfig
    ) -> RolloutBatch:
        """Decode one batch of rows. Shapes: B rows, A rows still decoding, U distinct prompts,
        Lp padded prompt length, V vocabulary."""
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = self._left_pad(prompts, device)  # [B, Lp]
        num_rows, max_new = len(prompts), sampling.max_new_tokens
        generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        warpers = _logits_warpers(sampling)
        penalty = _repetition_penalty(sampling)  # None at 1.0: not a single extra op
        # [B, Lp + max_new] the tokens each row has seen, for the penalty
        history = _penalty_history(prompt_ids, prompt_mask, max_new) if penalty is not None else None
        eos = torch.tensor(self.eos_token_ids, device=device)
        stops = _StopStrings(sampling.stop, self.tokenizer) if sampling.stop else None
        temperature = sampling.temperature

        logits, cache, row_prompt_mask = self._prefill(prompts, device)  # [B, V], [B, ...], [B, Lp]
        lp = row_prompt_mask.shape[1]
        # Columns: the prompt, then one per decoded token (all ones: finished rows leave).
        attention_mask = torch.ones(num_rows, lp + max_new, dtype=torch.long, device=device)
        attention_mask[:, :lp] = row_prompt_mask
        next_position = row_prompt_mask.sum(dim=1, keepdim=True)  # [B, 1]

        tokens = torch.full((num_rows, max_new), self.pad_token_id, dtype=torch.long, device=device)
        logps = torch.zeros((num_rows, max_new), dtype=torch.float32, device=device)
        masks = torch.zeros((num_rows, max_new), dtype=torch.bool, device=device)
        done = torch.zeros(num_rows, dtype=torch.bool, device=device)
        active = torch.arange(num_rows, device=device)  # [A] rows still decoding
        width = 0
        for step in range(max_new):
            # The penalty returns a new tensor: `logits` stay the model's own for the log-probs.
            penalised = logits if penalty is None else penalty(history[active, : lp + step], logits)
            scores = warpers(None, penalised / temperature)  # -inf outside the kept set
            token = _sample_rows(scores, [generators[i] for i in active.tolist()], device)
            tokens[active, step] = token
            logps[active, step] = token_logprobs(logits, token, temperature=temperature)  # before penalty and filters
            if history is not None:
                history[active, lp + step] = token
            masks[active, step] = True
            width = step + 1
            ended = torch.isin(token, eos)
            if stops is not None:
                ended |= stops.hit(tokens[active, : step + 1])
            done[active[ended]] = True
            if step + 1 == max_new or bool(ended.all()):
                break
            if bool(ended.any()):  # finished rows leave the batch: no more compute for them
                keep = (~ended).nonzero().squeeze(1)
                active, token, next_position = active[keep], token[keep], next_position[keep]
                attention_mask = attention_mask[keep]
                cache.batch_select_indices(keep)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=attention_mask[:, : lp + step + 1],
                position_ids=next_position,
                use_cache=True,
                **cache_kwargs(cache),
            )
            logits = out.logits[:, -1, :].float()  # [A, V]
            next_position = next_position + 1

        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=tokens[:, :width],
            response_mask=masks[:, :width],
            rollout_logp=logps[:, :width],
            group_index=torch.zeros(num_rows, dtype=torch.long, device=device),  # set by caller
            seeds=torch.tensor(seeds, dtype=torch.long, device=device),
            finished=done,
        )

    def _prefill(self, prompts: list[list[int]], device: torch.device) -> tuple[Tensor, DynamicCache, Tensor]:
        """Forward each distinct prompt once, then index its cache and last logits out to its
        rows. Returns the next-token logits [B, V] float32, the cache (B rows) and the rows'
        prompt mask [B, Lp] long."""
        distinct: dict[tuple[int, ...], int] = {}
        inverse = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts], device=device)
        ids, mask = self._left_pad([list(p) for p in distinct], device)  # [U, Lp]
        mask = mask.long()
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(dim=1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
            **cache_kwargs(DynamicCache(config=self.model.config)),
        )
        cache = output_cache(out)
        if len(distinct) < len(prompts):
            cache.batch_select_indices(inverse)
        return out.logits[:, -1, :].float()[inverse], cache, mask[inverse]

    def _left_pad(self, prompts: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = True
        return ids.to(device), mask.to(device)


def _logits_warpers(sampling: SamplingConfig) -> LogitsProcessorList:
    """transformers' filters, in the order ``generate`` applies them (after temperature)."""
    warpers = LogitsProcessorList()
    if sampling.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=sampling.top_p))
    if sampling.min_p > 0.0:
        warpers.append(MinPLogitsWarper(min_p=sampling.min_p))
    return warpers


def _repetition_penalty(sampling: SamplingConfig) -> RepetitionPenaltyLogitsProcessor | None:
    """transformers' repetition penalty (a token seen in the row: positive logit / penalty,
    negative logit * penalty), or None when it is 1 (off)."""
    if sampling.repetition_penalty == 1.0:
        return None
    return RepetitionPenaltyLogitsProcessor(penalty=float(sampling.repetition_penalty))


def _penalty_history(prompt_ids: Tensor, prompt_mask: Tensor, max_new: int) -> Tensor:
    """The token ids [B, Lp + max_new] the repetition penalty looks at: each row's prompt,
    then its response as it is decoded (written in by the loop at ``Lp + step``).

    The penalty marks every id it is given, and left padding is the pad token, which a prompt
    may not contain: counting it would make a row's sampling depend on the other prompts of its
    batch. So padding, and the response columns not decoded yet, hold the row's first prompt
    token, which the row has anyway (prompts are never empty): marking it again changes nothing.
    """
    first_real = (~prompt_mask).sum(dim=1, keepdim=True)  # [B, 1] index of the first prompt token
    first = prompt_ids.gather(1, first_real)  # [B, 1]
    history = first.expand(-1, prompt_ids.shape[1] + max_new).clone()
    history[:, : prompt_ids.shape[1]] = torch.where(prompt_mask, prompt_ids, first)
    return history


class _StopStrings:
    """Which rows' text now contains a stop string, vLLM's rule: checked after every token, on
    this call's tokens only. Only the last ``window`` tokens are decoded: a token decodes to at
    least one character, so a string completed by the newest token lies within its last
    ``len(string)`` tokens (and a few more for decoding at the window's edge)."""

    def __init__(self, stop: tuple[str, ...], tokenizer) -> None:
        self.stop, self.tokenizer = stop, tokenizer
        self.window = max(len(s) for s in stop) + 4

    def hit(self, tokens: Tensor) -> Tensor:  # [A, step + 1] long -> [A] bool
        texts = self.tokenizer.batch_decode(tokens[:, -self.window:].tolist(), skip_special_tokens=False)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], device=tokens.device)


def _sample_rows(scores: Tensor, generators: list[torch.Generator], device: torch.device) -> Tensor:
    """One token per row from ``softmax(scores)`` [B, V] by inverse-CDF sampling, row ``b``
    drawing its single uniform from ``generators[b]`` alone.

    Why not Gumbel-max: it needs V random numbers and two logs per row and step, where this
    needs one uniform and a cumulative sum; on a vocabulary of tens of thousands that
    difference dominates a CPU decoding step. ``side="right"`` never lands on a zero-probability token: the
    first index whose cumulative mass exceeds ``u * total`` has positive mass.
    """
    probs = torch.softmax(scores, dim=-1)  # filtered tokens (-inf) get 0
    cdf = probs.cumsum(dim=-1)
    u = torch.cat([torch.rand(1, generator=g, device=device) for g in generators])
    token = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    return token.clamp_(max=scores.shape[-1] - 1)
