"""CIW, model side: the masked forward passes of METHOD 8.3, and the scorer that turns a
rollout batch into CIW token weights (the formulas are in ``ibpo_lit/algorithms/ciw.py``).

For one response with prompt ``x``, content ``y`` (its tokens before the closing EOS), answer
region ``y[a:n]`` and spans ``S_1..S_K`` of the reasoning region, the drop of span k is
``sum_{t=a}^{n-1} log pi(y_t | x, y_<t) - sum_{t=a}^{n-1} log pi(y_t | x, y~k_<t)``, with
``y~k`` = ``y`` whose tokens in ``S_k`` are replaced by the mask id (pad, or EOS). The answer
tokens themselves are never masked: they are teacher-forced in every copy.

What is covered:
    * ``token_pieces``: each token's share of the decoded text (fast path: tokens decoded one
      by one, used when they join to the full decode; otherwise incremental decoding that
      gives a character split over several byte tokens to the token that completes it, each
      decode of at most ``2 * MAX_PENDING_TOKENS`` tokens: linear in the response's length).
    * ``span_drops_batched``: the full copy and all K masked copies of a response go through
      the model in ONE forward pass (under ``torch.no_grad``); copies of several responses
      share a pass while ``tokens_per_pass`` allows (never splitting one response's copies).
      Sequences are right-padded: with a causal mask, padding after a position never reaches
      it, so no attention mask is needed and position ids are the plain ``0..L-1``. Only the
      logits from the earliest answer position on are computed (``logits_to_keep``). Under
      ``rollout.packing`` (``packed=True``) a pass's copies are laid end to end instead, no
      padding, ``position_ids`` restarting per copy, only the answer positions to the head,
      and ``tokens_per_pass`` counts real tokens.
    * ``CIWScorer``: layouts, cached drops and weights for a ``RolloutBatch``, with metrics.
      The cache is keyed by (prompt ids, content ids) and holds one policy version
      (``step``): a new step clears it, since drops depend on the weights. Identical
      responses to one prompt (frequent at small G or short answers) are scored once.

What is not covered:
    * Which model to use: the caller passes the policy (pi_old, before the batch's first
      update, so the weights do not change across mini-batches) in the mode it wants; the
      scorer does not toggle ``train()``/``eval()`` (dropout would make drops noisy).
    * Sharded models: under FSDP2 each rank scores its own rows with the sharded module like
      any other forward pass, but every forward is a collective: given a ``sync``
      (``ibpo_lit.scale.RankSync``), the ranks agree on the largest number of passes and the
      others run one-token passes whose output is discarded.

Rows without an answer marker get weight 1 on every token and cost no forward pass (there is
no answer to measure); so do rows with a marker but no span (their reasoning weights are the
degenerate ``importance_low`` of ``algorithms/ciw.py``, with no pass needed).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch
from torch import Tensor

from ibpo_lit.algorithms.ciw import (
    CIWConfig,
    ResponseLayout,
    ciw_metrics,
    layout_response,
    layout_weights,
)
from ibpo_lit.algorithms.logprobs import token_logprobs
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.seeds import stream_seed


# ------------------------------------------------------------------ tokens -> text
def _decoders(tokenizer) -> tuple[Callable[[list[int]], str], Callable[[list[list[int]]], list[str]]]:
    """(decode one list, decode many lists), special tokens kept, no clean-up of spaces."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # a fast tokenizer: call Rust directly, no per-call Python overhead
        return (
            lambda ids: backend.decode(ids, skip_special_tokens=False),
            lambda batch: backend.decode_batch(batch, skip_special_tokens=False),
        )

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    return decode, lambda batch: [decode(ids) for ids in batch]


# Tokens whose text may wait for a later token: a UTF-8 character is at most 4 bytes (4 byte
# tokens), so a run of 16 that has not decoded to whole characters never will. Past it the run's
# own decode is its last token's piece; without the cap, a response of such bytes (policy output)
# made every later decode start at the run's first token: quadratic in the response's length.
MAX_PENDING_TOKENS = 16


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """[n] strings, one per token id, whose concatenation is the decoded text.

    Fast path: tokens decoded one by one, when they join to the full decode (character-level
    and byte-level BPE tokenizers on most text). Otherwise incremental decoding, as vLLM's
    detokenizer does: token i's piece is what decoding up to i adds to the text decoded
    before it, with the previous emitted chunk as context (SentencePiece drops a leading
    space at the start of a decode); while the text ends in U+FFFD (an incomplete UTF-8
    character), the piece is empty and the text goes to the token that completes it. A run of
    `MAX_PENDING_TOKENS` that completes nothing (invalid UTF-8: not text) gets the run's own
    decode as its last token's piece, so every decode is of a bounded number of tokens: linear in
    the response's length. There, and only there, the pieces may join to other replacement
    characters than the whole text's decode has.
    """
    ids = [int(i) for i in ids]
    decode, decode_batch = _decoders(tokenizer)
    singles = decode_batch([[i] for i in ids])
    if "".join(singles) == decode(ids):
        return list(singles)
    pieces: list[str] = []
    prefix, read = 0, 0  # context starts at token `prefix`; tokens before `read` are emitted
    for i in range(len(ids)):
        before = decode(ids[prefix:read])
        after = decode(ids[prefix : i + 1])
        if len(after) > len(before) and not after.endswith("\ufffd") and after.startswith(before):
            pieces.append(after[len(before) :])
            prefix, read = read, i + 1
        elif i + 1 - read >= MAX_PENDING_TOKENS:  # never completes: not text (invalid UTF-8 bytes)
            pieces.append(decode(ids[read : i + 1]))
            prefix, read = i + 1, i + 1
        else:
            pieces.append("")
    return pieces


def mask_token_id(tokenizer, cfg: CIWConfig) -> int:
    """The id that replaces masked span tokens (``cfg.mask_token``: pad, else EOS; or EOS)."""
    first, second = (
        (tokenizer.pad_token_id, tokenizer.eos_token_id)
        if cfg.mask_token == "pad"
        else (tokenizer.eos_token_id, tokenizer.pad_token_id)
    )
    mask_id = first if first is not None else second
    if mask_id is None:
        raise ValueError("CIW needs a mask id: the tokenizer has neither a pad nor an EOS token")
    return int(mask_id)


def content_length(ids: Sequence[int], stop_ids: set[int]) -> int:
    """Tokens of a response before its first stop token (the closing EOS)."""
    for i, token in enumerate(ids):
        if int(token) in stop_ids:
            return i
    return len(ids)


# ------------------------------------------------------------------ masked forward passes
def _copies(prompt: list[int], content: list[int], layout: ResponseLayout, mask_id: int) -> list[list[int]]:
    """[1 + K] sequences ``prompt + content``: unmasked first, then span k masked."""
    full = prompt + content
    copies = [full]
    for span in layout.spans:
        masked = list(full)
        masked[len(prompt) + span.start : len(prompt) + span.end] = [mask_id] * (span.end - span.start)
        copies.append(masked)
    return copies


def _needs_pass(layout: ResponseLayout) -> bool:
    return layout.answer_start is not None and len(layout.spans) > 0


@torch.no_grad()
def span_drops_batched(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    contents: Sequence[list[int]],
    layouts: Sequence[ResponseLayout],
    mask_id: int,
    *,
    temperature: float = 1.0,
    tokens_per_pass: int = 8192,
    sync=None,
    packed: bool = False,
) -> tuple[list[list[float]], dict[str, int]]:
    """Answer log-prob drop of every span of every response, batched.

    Args:
        model: a causal LM taking ``input_ids``, ``use_cache`` and ``logits_to_keep``.
        prompts: [B] unpadded prompt ids.
        contents: [B] response ids before the closing EOS (``layouts[b].length`` of them).
        layouts: [B] regions and spans (``algorithms.ciw.layout_response``).
        mask_id: the id written over masked span tokens.
        temperature: logits are divided by it (the sampled policy's log-probs).
        tokens_per_pass: budget of sequences x padded length of one pass (``packed``: of the
            sum of their lengths).
        sync: a ``RankSync`` when forwards are collectives (FSDP2): every rank then runs as
            many passes as the busiest one.
        packed: each pass's copies laid end to end in one sequence (`_packed_answer_logp`),
            as ``rollout.packing`` packs the trainer's forwards; the caller decides
            (``PolicyUpdate.packed``: the model's attention keeps packed rows apart).

    Returns:
        drops: [B] lists, ``drops[b][k]`` for ``layouts[b].spans[k]`` (empty without spans
            or marker).
        stats: ``passes`` (forward calls) and ``tokens`` (real tokens forwarded).
    """
    device = next(model.parameters()).device
    drops: list[list[float]] = [[] for _ in layouts]
    todo = [b for b, layout in enumerate(layouts) if _needs_pass(layout)]
    todo.sort(key=lambda b: len(prompts[b]) + layouts[b].length)  # similar lengths share a pass

    passes: list[list[int]] = []
    rows: list[int] = []
    n_seqs = width = real = 0  # of the pass being filled
    for b in todo:
        n_copies, length = 1 + len(layouts[b].spans), len(prompts[b]) + layouts[b].length
        cost = real + n_copies * length if packed else (n_seqs + n_copies) * max(width, length)
        if rows and cost > tokens_per_pass:
            passes.append(rows)
            rows, n_seqs, width, real = [], 0, 0, 0
        rows.append(b)
        n_seqs, width, real = n_seqs + n_copies, max(width, length), real + n_copies * length
    if rows:
        passes.append(rows)

    # Agreed before any pass: a rank already inside a forward (an all-gather) cannot answer.
    padding = (sync.max(len(passes)) if sync is not None else len(passes)) - len(passes)
    total_tokens = 0
    for rows in passes:
        seqs, owner = [], []
        for b in rows:
            for copy in _copies(list(prompts[b]), list(contents[b][: layouts[b].length]), layouts[b], mask_id):
                seqs.append(copy)
                owner.append(b)
        total_tokens += sum(len(s) for s in seqs)

        # Position p predicts token p + 1; response b's answer tokens sit at
        # [P_b + a_b, P_b + n_b), so the positions needed are [P_b + a_b - 1, P_b + n_b - 1).
        seq_idx, pos_idx = [], []
        for j, b in enumerate(owner):
            p, layout = len(prompts[b]), layouts[b]
            positions = range(p + layout.answer_start - 1, p + layout.length - 1)
            seq_idx.extend([j] * len(positions))
            pos_idx.extend(positions)
        seq_t = torch.tensor(seq_idx, device=device)
        if packed:
            logp = _packed_answer_logp(model, seqs, seq_idx, pos_idx, temperature, device)
        else:
            width = max(len(s) for s in seqs)
            input_ids = torch.full((len(seqs), width), mask_id, dtype=torch.long)
            for j, seq in enumerate(seqs):
                input_ids[j, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            first = min(pos_idx)
            input_ids = input_ids.to(device)
            logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=width - first).logits  # [N, keep, V]
            pos_t = torch.tensor(pos_idx, device=device)
            logp = token_logprobs(logits[seq_t, pos_t - first], input_ids[seq_t, pos_t + 1], temperature)  # [M]
        answer_logp = torch.zeros(len(seqs), dtype=torch.float32, device=device).index_add_(0, seq_t, logp)
        answer_logp = answer_logp.cpu().tolist()

        j = 0
        for b in rows:
            k = len(layouts[b].spans)
            full = answer_logp[j]
            drops[b] = [full - masked for masked in answer_logp[j + 1 : j + 1 + k]]
            j += 1 + k
    for _ in range(padding):
        model(input_ids=torch.full((1, 1), mask_id, dtype=torch.long, device=device), use_cache=False, logits_to_keep=1)
    return drops, {"passes": len(passes), "tokens": total_tokens}


def _packed_answer_logp(model: torch.nn.Module, seqs: list[list[int]], seq_idx: list[int], pos_idx: list[int],
                        temperature: float, device) -> Tensor:
    """[M] log-probs of the tokens at ``pos_idx + 1`` of ``seqs[seq_idx]``, from one forward of
    ``seqs`` laid end to end ([1, N], no padding) with ``position_ids`` restarting at each: with
    no attention mask and no cache, transformers keeps attention within each sequence (as for
    ``training/packing.py``'s rows). Only the M predicting positions reach the LM head."""
    starts = [0]
    for seq in seqs[:-1]:
        starts.append(starts[-1] + len(seq))
    input_ids = torch.tensor([t for seq in seqs for t in seq], dtype=torch.long, device=device).unsqueeze(0)
    position_ids = torch.cat([torch.arange(len(seq)) for seq in seqs]).unsqueeze(0).to(device)
    predicting = torch.tensor([starts[j] + p for j, p in zip(seq_idx, pos_idx)], dtype=torch.long, device=device)
    logits = model(input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=False,
                   logits_to_keep=predicting).logits[0]  # [M, V]
    return token_logprobs(logits, input_ids[0, predicting + 1], temperature)


# ------------------------------------------------------------------ the scorer
@dataclass
class CIWResult:
    weights: Tensor  # [B, Lr] float32 on the CPU, 1 on padding and unscored rows
    layouts: list[ResponseLayout | None]  # [B], None for rows not scored
    drops: list[list[float]]  # [B] one drop per span ([] for rows not scored)
    metrics: dict[str, float]  # "ciw/..." scalars


class CIWScorer:
    """CIW token weights of rollout batches, with a cache of drops per policy version.

    Usage (once per rollout batch, before its first update)::

        scorer = CIWScorer(cfg, tokenizer)
        result = scorer(policy, batch, rows=advantages != 0, step=global_step)
        token_weights = result.weights if ibpo_w is None else ibpo_w * result.weights
    """

    def __init__(self, cfg: CIWConfig, tokenizer) -> None:
        self.cfg = cfg if cfg.seed is not None else replace(cfg, seed=stream_seed(None))  # (`ibpo_lit.seeds`)
        self.tokenizer = tokenizer
        self.mask_id = mask_token_id(tokenizer, cfg)
        self.stop_ids = {int(t) for t in (tokenizer.eos_token_id, tokenizer.pad_token_id) if t is not None}
        self._cache: OrderedDict[tuple, tuple[ResponseLayout, list[float]]] = OrderedDict()
        self._cache_step: int | None = None

    def clear_cache(self) -> None:
        self._cache.clear()

    @torch.no_grad()
    def __call__(
        self,
        model: torch.nn.Module,
        batch: RolloutBatch,
        *,
        rows: Tensor | Sequence[bool] | None = None,
        step: int = 0,
        temperature: float = 1.0,
        sync=None,
        packed: bool = False,
    ) -> CIWResult:
        """Weights [B, Lr] for ``batch`` under ``model``.

        Args:
            model: the policy whose drops define importance (no gradient is taken).
            batch: the rollouts (prompts left-padded, responses right-padded).
            rows: [B] bool, the rows to weight (e.g. ``advantages != 0``: a zero-advantage
                row gets no gradient whatever its weights); others get weight 1 and cost
                nothing. None = all rows.
            step: the policy version: the cache only serves drops of the same ``step``, and
                the ``random`` ablation draws from a generator seeded with (``cfg.seed``, step).
            temperature: the sampling temperature (log-probs of the sampled policy).
            sync: a ``RankSync`` when the model's forwards are collectives (see
                ``span_drops_batched``).
            packed: each pass's copies packed into one sequence (``rollout.packing``, as
                resolved for ``model``: ``span_drops_batched``).
        """
        start = time.perf_counter()
        cfg = self.cfg
        if step != self._cache_step:
            self._cache.clear()
            self._cache_step = step
        n, width = batch.response_ids.shape
        selected = list(range(n)) if rows is None else [int(i) for i in torch.as_tensor(rows).nonzero().flatten()]
        prompt_lists = batch.prompt_lists()
        response_lists = batch.response_lists()
        tool_lists = [row[m].tolist() for row, m in zip(batch.tool_mask, batch.response_mask)]

        keys, todo = {}, {}  # row -> cache key; key -> (prompt, content, layout) to compute
        hits = 0
        for r in selected:
            content = response_lists[r][: content_length(response_lists[r], self.stop_ids)]
            tool = tool_lists[r][: len(content)]  # tool-output tokens: never reasoning
            key = (tuple(prompt_lists[r]), tuple(content), tuple(tool))
            keys[r] = key
            if key in self._cache:
                self._cache.move_to_end(key)
                hits += 1
            elif key in todo:
                hits += 1  # a duplicate within the batch
            else:
                layout = layout_response(token_pieces(self.tokenizer, content), cfg, tool=tool)
                todo[key] = (prompt_lists[r], content, layout)

        found = {key: self._cache[key] for key in set(keys.values()) if key in self._cache}
        pending = list(todo.items())
        drops, stats = span_drops_batched(
            model,
            [p for _, (p, _, _) in pending],
            [c for _, (_, c, _) in pending],
            [l for _, (_, _, l) in pending],
            self.mask_id,
            temperature=temperature,
            tokens_per_pass=cfg.tokens_per_pass,
            sync=sync,
            packed=packed,
        )
        for (key, (_, _, layout)), row_drops in zip(pending, drops):
            found[key] = (layout, row_drops)
            if cfg.cache_size > 0:
                self._cache[key] = (layout, row_drops)
                if len(self._cache) > cfg.cache_size:
                    self._cache.popitem(last=False)

        layouts = [found[keys[r]][0] for r in selected]
        span_drops = [found[keys[r]][1] for r in selected]
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        weights = torch.ones(n, width, dtype=torch.float32)
        if selected:
            weights[selected] = layout_weights(layouts, span_drops, width, cfg, generator)

        all_layouts: list[ResponseLayout | None] = [None] * n
        all_drops: list[list[float]] = [[] for _ in range(n)]
        for r, layout, row_drops in zip(selected, layouts, span_drops):
            all_layouts[r], all_drops[r] = layout, row_drops
        metrics = ciw_metrics(layouts, span_drops, weights[selected])
        metrics.update(
            {
                "ciw/rows_scored": float(len(selected)),
                "ciw/cache_hits": float(hits),
                "ciw/forward_passes": float(stats["passes"]),
                "ciw/forward_tokens": float(stats["tokens"]),
                "ciw/overhead_s": time.perf_counter() - start,
            }
        )
        return CIWResult(weights, all_layouts, all_drops, metrics)
