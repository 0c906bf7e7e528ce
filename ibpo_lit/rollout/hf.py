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
    * Per-rollout seeds: row ``b`` draws its sampling uniforms from a source of its own seeded
      with ``seeds[b]``, so its tokens depend only on (prompt, seed, weights).
    * ``rollout_logp``: log-prob of each sampled token under ``softmax(logits / temperature)``
      before the repetition penalty and top-k/top-p/min-p filtering, through ``token_logprobs``
      (the trainer's function): the model's own distribution, the one the trainer trains.
    * No work twice: each distinct prompt is prefilled once and its KV cache indexed out to its
      ``n`` rows.
    * Two decodes (``decode``), one sampler (`_draw`: penalty, temperature, filters,
      inverse-CDF sampling, log-prob) over two caches and two uniform sources:

      - ``dynamic`` (the default): a ``DynamicCache`` that grows a column a step; a row that
        ends leaves the batch (its cache rows are dropped), so the steps after it cost nothing
        for it (what that saves: docs/benchmarks.md). Uniforms from one ``torch.Generator`` per
        row.
      - ``static``: the prefill copied into a ``transformers.StaticCache`` of [rows, prompt +
        max_new_tokens], made once per batch; every row stays to the batch's last step (a row
        that ended keeps decoding into its own columns, nothing of it recorded), so every step
        has the same shapes. Uniforms from `counter_uniforms` (Philox on (seed, step), in
        ``counter_rng``): no Python loop over rows. The step (forward, log-prob, sampling) is
        thereby one fixed-shape function; its forward is compiled with CUDA graphs on a GPU
        (``compile_step``; the sampler stays eager: `_static_forward` says why).
        Every sampling setting works as in ``dynamic`` (stop strings check the text on the
        host after each step, so with them each step waits for the device). With the same
        uniforms the two decodes draw the same tokens (tests/rollout/test_static_decode.py); with
        their own sources, the same seed gives other samples in each: a run keeps one decode.

    * A policy sharded with FSDP2: its weights are gathered for the whole call
      (``ibpo_lit.scale.fsdp2.gathered_weights``), so each decoding step runs without
      collectives and ranks may decode different numbers of steps. Every rank must call
      ``generate`` equally often (with no prompts where it has none): entering is a
      collective. It needs one full copy of the weights per rank while it decodes. Both decodes;
      the static one decodes a sharded policy eagerly unless ``compile_step`` says otherwise.

What is not covered:
    * Speed beyond that: one process, one batch, no continuous batching or paged attention.
      Use it for tests, small models and as the reference the faster engines are checked
      against. The static decode's speed on a GPU (``scripts/bench_decode.py``, arm
      ``hf_engine_static``) is not measured yet; a static batch pays for its ended rows until
      its last row ends, which the dynamic one does not.
    * The static decode of models whose cache is not full attention in every layer (sliding
      windows, linear attention): refused with a message. A new ``StaticCache`` per batch
      means a CUDA-graph step re-records its graph each call (as transformers' own static
      ``generate`` does).
    * Bit-exact reproducibility across batch compositions is as good as the kernels: a row's
      logits can differ in the last float bits between batch shapes, which flips a sampled
      token only if the row's uniform falls within that error of a CDF boundary.

Why not ``model.generate``: it samples every row from one global RNG, so a response depends on
which other rows share its batch and in what order; and it returns scores only after all
processors, not the log-prob of each sampled token under the temperature-scaled policy. Our
loop gives each row its own uniforms and computes the log-probs in the same pass.
"""
from __future__ import annotations

from typing import Sequence, get_args

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel, StaticCache
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
from ibpo_lit.rollout.counter_rng import counter_uniforms, seed_keys
from ibpo_lit.rollout.engine import HFDecode, RolloutEngine, SamplingConfig, check_generate_args
from ibpo_lit.scale.fsdp2 import fsdp_modules, gathered_weights

DECODES = get_args(HFDecode)
"""``HFRolloutEngine(decode=...)``: a growing cache whose finished rows leave, or a static one."""
_DONE_CHECK_EVERY = 8  # static decode: steps between checks that every row is done (each waits for the device)


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
        decode: ``dynamic`` (the default): a KV cache that grows by a column a step, finished rows
            leave the batch, per-row ``torch.Generator`` uniforms. ``static``: a
            ``transformers.StaticCache`` of [rows, prompt + max_new_tokens] allocated once per
            batch, every row decoded to the batch's end (a finished row's later tokens are not
            recorded), per-row counter-based uniforms (`counter_uniforms`), so the decode step
            has fixed shapes and no Python loop over rows: it can run as one CUDA graph. The two
            are the same sampler over different caches and uniform sources: a row's tokens
            depend on (prompt, seed, weights, decode), not on its batch.
        compile_step: ``decode="static"`` only: ``torch.compile`` the decode step's forward over the
            static cache (the log-prob and the sampling stay eager, `_static_forward` says why):
            ``mode="reduce-overhead"`` (CUDA graphs) on a GPU, inductor's default mode on a CPU. None (the default): on a CUDA device for a policy
            not sharded with FSDP2, eager otherwise (`compiles_step`). Eager on a CPU: there the
            compilation takes a minute or more for a real model (and again at the second distinct
            batch shape, which then compiles for any shape), and on a loaded 2-core CPU the
            compiled step saved little a call against the eager one (SmolLM2-135M, fp32), which
            a run's few decode calls do not win back. A sharded policy's forward runs FSDP2's
            hooks, which this step has not been compiled through.
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
        decode: HFDecode = "dynamic",
        compile_step: bool | None = None,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("HFRolloutEngine needs at least one eos_token_id")
        if decode not in DECODES:
            raise ValueError(f"HFRolloutEngine decode must be one of {', '.join(DECODES)}, got {decode!r}")
        if compile_step and decode != "static":
            raise ValueError("HFRolloutEngine compile_step needs decode='static' (the dynamic decode's shapes "
                             "change every step)")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        self.model = model
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.pad_token_id = int(pad_token_id)
        self.sampling = sampling
        self.max_batch_size = max_batch_size
        self.reshard_after_forward = reshard_after_forward
        self.tokenizer = tokenizer
        self.decode = decode
        self.compile_step = compile_step
        self._compiled_step = None  # made at the first compiled call, then reused (its graphs with it)

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
        decode_rows = self._generate_rows_static if self.decode == "static" else self._generate_rows
        was_training = self.model.training
        self.model.eval()
        try:
            # eager(): layers compiled for training (model.torch_compile) would recompile at every
            # new cache length here
            with torch.no_grad(), eager(), gathered_weights(self.model, self.reshard_after_forward):
                parts = [
                    decode_rows(rows[i : i + chunk], seeds[i : i + chunk], sampling)
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
            seen = history[active, : lp + step] if history is not None else None
            token, logp = _draw(logits, self._dynamic_uniforms(generators, active, step), temperature,
                                warpers, penalty, seen)
            tokens[active, step] = token
            logps[active, step] = logp
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

        return _rows_batch(prompt_ids, prompt_mask, tokens, masks, logps, done, seeds, width=width)

    def _dynamic_uniforms(self, generators: list[torch.Generator], active: Tensor, step: int) -> Tensor:
        """The dynamic decode's uniforms at ``step`` for the rows ``active``: one draw from each
        row's own generator. (A method so a test can feed the dynamic decode the static one's
        uniforms and show the two decodes are one sampler.)"""
        return _generator_uniforms([generators[i] for i in active.tolist()], generators[0].device)

    def _generate_rows_static(
        self, prompts: list[list[int]], seeds: list[int], sampling: SamplingConfig
    ) -> RolloutBatch:
        """Decode one batch of rows over a static cache, every row to the batch's last step (the
        same results as `_generate_rows` but for the uniforms' source). Shapes: B rows, Lp padded
        prompt length, V vocabulary, L = Lp + max_new_tokens the cache's length."""
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = self._left_pad(prompts, device)  # [B, Lp]
        num_rows, max_new = len(prompts), sampling.max_new_tokens
        keys = seed_keys(seeds, device)  # [B, 2]
        steps = torch.arange(max_new, device=device)  # step t as a tensor: a compiled step never specialises on it
        warpers = _logits_warpers(sampling)
        penalty = _repetition_penalty(sampling)
        # The whole row: the columns not decoded yet hold the row's first prompt token, which the
        # penalty counts anyway (`_penalty_history`), so the full width serves every step.
        history = _penalty_history(prompt_ids, prompt_mask, max_new) if penalty is not None else None
        eos = torch.tensor(self.eos_token_ids, device=device)
        stops = _StopStrings(sampling.stop, self.tokenizer) if sampling.stop else None
        temperature = sampling.temperature

        logits, prefill_cache, row_prompt_mask = self._prefill(prompts, device)  # [B, V], B rows, [B, Lp]
        lp = row_prompt_mask.shape[1]
        cache = _static_cache(self.model, prefill_cache, lp + max_new)
        del prefill_cache
        # Every column is the prompt's or a decoded token's: a finished row keeps decoding into
        # its own columns, which nothing records.
        attention_mask = torch.ones(num_rows, lp + max_new, dtype=torch.long, device=device)
        attention_mask[:, :lp] = row_prompt_mask
        start = row_prompt_mask.sum(dim=1, keepdim=True)  # [B, 1] position of each row's first new token

        tokens = torch.full((num_rows, max_new), self.pad_token_id, dtype=torch.long, device=device)
        logps = torch.zeros((num_rows, max_new), dtype=torch.float32, device=device)
        masks = torch.zeros((num_rows, max_new), dtype=torch.bool, device=device)
        done = torch.zeros(num_rows, dtype=torch.bool, device=device)
        decode_step = self._decode_step(device)
        token, logp = _draw(logits, counter_uniforms(keys, steps[0]), temperature, warpers, penalty, history)
        for step in range(max_new):
            if step:
                token, logp = decode_step(self.model, cache, token, start + (step - 1), attention_mask, keys,
                                          steps[step], temperature, warpers, penalty, history)
            live = ~done
            tokens[:, step] = torch.where(live, token, self.pad_token_id)
            logps[:, step] = torch.where(live, logp, 0.0)
            masks[:, step] = live
            if history is not None:
                history[:, lp + step] = token
            ended = live & torch.isin(token, eos)
            if stops is not None:
                rows = live.nonzero().squeeze(1)
                ended[rows] |= stops.hit(tokens[rows, : step + 1])
            done |= ended
            # Asking whether every row is done waits for the device: with a captured step, only
            # every few steps (results do not depend on it: later steps record nothing for them).
            if step + 1 < max_new and (stops is not None or (step + 1) % _DONE_CHECK_EVERY == 0) and bool(done.all()):
                break
        width = int(masks.any(dim=0).sum())  # every row decodes step 0, and a row's mask is a prefix

        return _rows_batch(prompt_ids, prompt_mask, tokens, masks, logps, done, seeds, width=width)

    def compiles_step(self, device: torch.device) -> bool:
        """Whether the static decode compiles its step on ``device``: ``compile_step``, or when
        it is None, on a CUDA device for a policy not sharded with FSDP2."""
        if self.decode != "static":
            return False
        if self.compile_step is not None:
            return self.compile_step
        return torch.device(device).type == "cuda" and not fsdp_modules(self.model)

    def _decode_step(self, device: torch.device):
        """`_static_decode_step`, compiled as `compiles_step` says."""
        if not self.compiles_step(device):
            return _static_decode_step
        if self._compiled_step is None:
            mode = "reduce-overhead" if device.type == "cuda" else None  # CUDA graphs on a GPU
            self._compiled_step = torch.compile(_static_forward, mode=mode)
        compiled = self._compiled_step

        def step(model, cache, token, position, attention_mask, keys, step, temperature, warpers, penalty, history):
            # generate() runs under eager() (the trainer's compiled layers must not recompile at
            # every cache length); this forward's shapes are fixed, so it leaves that stance.
            with torch.compiler.set_stance("default"):
                if device.type == "cuda":
                    torch.compiler.cudagraph_mark_step_begin()
                # A CUDA graph's outputs are overwritten by its next replay: keep a copy.
                logits = compiled(model, cache, token, position, attention_mask).clone()
            return _draw(logits, counter_uniforms(keys, step), temperature, warpers, penalty, history)

        return step

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


def _rows_batch(prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, masks: Tensor, logps: Tensor,
                finished: Tensor, seeds: list[int], width: int) -> RolloutBatch:
    """One batch of decoded rows as a ``RolloutBatch``, the same for both decodes: the first
    ``width`` columns (those some row decoded) of the response buffers ``tokens``, ``masks`` and
    ``logps`` [B, max_new], each row's seed, and ``group_index`` zeros (``generate`` sets it)."""
    device = tokens.device
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=tokens[:, :width],
        response_mask=masks[:, :width],
        rollout_logp=logps[:, :width],
        group_index=torch.zeros(tokens.shape[0], dtype=torch.long, device=device),  # set by the caller
        seeds=torch.tensor(seeds, dtype=torch.long, device=device),
        finished=finished,
    )


def _draw(logits: Tensor, u: Tensor, temperature: float, warpers: LogitsProcessorList,
          penalty: RepetitionPenaltyLogitsProcessor | None, history: Tensor | None) -> tuple[Tensor, Tensor]:
    """One decoding step's sampling, the same in both decodes: the repetition penalty on the raw
    ``logits`` [B, V] (over ``history``, the tokens each row has seen), the temperature, the
    filters, then inverse-CDF sampling with the uniforms ``u`` [B]. Returns the tokens [B] and
    their log-probs [B] under ``softmax(logits / temperature)``: the model's own distribution,
    before the penalty and the filters (the one the trainer trains)."""
    # The penalty returns a new tensor: `logits` stay the model's own for the log-probs.
    penalised = logits if penalty is None else penalty(history, logits)
    scores = warpers(None, penalised / temperature)  # -inf outside the kept set
    token = _inverse_cdf(scores, u)
    return token, token_logprobs(logits, token, temperature=temperature)


def _static_decode_step(model, cache, token: Tensor, position: Tensor, attention_mask: Tensor, keys: Tensor,
                        step: Tensor, temperature: float, warpers: LogitsProcessorList,
                        penalty: RepetitionPenaltyLogitsProcessor | None,
                        history: Tensor | None) -> tuple[Tensor, Tensor]:
    """The static decode's step, fixed shapes throughout: forward the last tokens [B] at
    ``position`` [B, 1] over the static ``cache`` (which writes their keys and values into
    its next column), then draw step ``step``'s tokens with the rows' counter uniforms.
    ``attention_mask`` [B, L] covers the cache's every column. Returns the tokens [B] and
    their log-probs [B] (`_draw`)."""
    logits = _static_forward(model, cache, token, position, attention_mask)
    return _draw(logits, counter_uniforms(keys, step), temperature, warpers, penalty, history)


def _static_forward(model, cache, token: Tensor, position: Tensor, attention_mask: Tensor) -> Tensor:
    """The static step's forward: the last tokens [B] at ``position`` [B, 1] over the static
    ``cache``; the next-token logits [B, V] float32. This is the part compiled: inductor's CUDA
    scan fails to generate code for the sampler's cumsum over a 151,936-token vocabulary
    (``InductorError`` in SplitScan codegen, torch 2.11, H200, 2026-11-27), so the sampler stays
    eager, as in transformers' own compiled ``generate``."""
    out = model(input_ids=token[:, None], attention_mask=attention_mask, position_ids=position, use_cache=True,
                **cache_kwargs(cache))
    return out.logits[:, -1, :].float()


def _static_cache(model: PreTrainedModel, prefill: DynamicCache, length: int) -> StaticCache:
    """A ``StaticCache`` of ``length`` columns holding the prefill's keys and values in its first
    columns (the prefill ran on a dynamic cache: each distinct prompt once, then indexed out to
    its rows). Refuses models whose cache is not full attention in every layer (sliding windows,
    linear attention), which this decode does not handle."""
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=model.config, max_cache_len=length)
    if len(cache.layers) != len(prefill.layers) or any(type(layer) is not StaticLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise ValueError(f"HFRolloutEngine decode='static' handles full-attention caches only; "
                         f"{type(model).__name__}'s static cache has {', '.join(kinds)} layers: use decode='dynamic'")
    if not isinstance(getattr(cache.layers[0], "cumulative_length", None), Tensor):
        raise ValueError("HFRolloutEngine decode='static' needs a transformers whose StaticLayer counts its own "
                         "length in a tensor (cumulative_length: transformers 5.17 and 5.19 do); use decode='dynamic'")
    for layer, filled in zip(cache.layers, prefill.layers):
        layer.lazy_initialization(filled.keys, filled.values)  # zeros [B, heads, length, dim], static addresses
        written = filled.keys.shape[-2]
        layer.keys[:, :, :written].copy_(filled.keys)
        layer.values[:, :, :written].copy_(filled.values)
        layer.cumulative_length.fill_(written)
    return cache


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
    drawing its single uniform from ``generators[b]`` alone (`_generator_uniforms`, `_inverse_cdf`)."""
    return _inverse_cdf(scores, _generator_uniforms(generators, device))


def _generator_uniforms(generators: list[torch.Generator], device: torch.device) -> Tensor:
    """[B] float32 in [0, 1): one draw from each row's own generator (the dynamic decode's source)."""
    return torch.cat([torch.rand(1, generator=g, device=device) for g in generators])


def _inverse_cdf(scores: Tensor, u: Tensor) -> Tensor:
    """One token per row from ``softmax(scores)`` [B, V]: the first whose cumulative probability
    exceeds ``u[b]`` (in [0, 1)) times the row's total. Both decodes sample with it, from
    different uniform sources (generators, `counter_uniforms`).

    Why not Gumbel-max: it needs V random numbers and two logs per row and step, where this
    needs one uniform and a cumulative sum; on a vocabulary of tens of thousands that
    difference dominates a CPU decoding step. ``side="right"`` never lands on a zero-probability token: the
    first index whose cumulative mass exceeds ``u * total`` has positive mass.
    """
    probs = torch.softmax(scores, dim=-1)  # filtered tokens (-inf) get 0
    cdf = probs.cumsum(dim=-1)
    token = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    return token.clamp_(max=scores.shape[-1] - 1)
