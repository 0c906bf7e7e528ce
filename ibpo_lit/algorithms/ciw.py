"""Counterfactual importance weighting, CIW (METHOD section 8): the pure parts.

A response is split into a *reasoning region* and an *answer region* at the final-answer
marker; spans of the reasoning region are masked one at a time (``ibpo_lit/training/ciw_scorer.py``
runs those forward passes); each span's answer log-prob drop becomes token importance, and
importance becomes a per-token weight ``w_t`` for ``gspo_loss`` / ``grpo_loss``
(``token_weights``, [B, T] float32).

Everything here works on a response's *pieces*: one string per token (the token's share of
the decoded text, ``"".join(pieces)`` being the text), so the same code serves a
character-level tokenizer and BPE. ``ciw_scoring.token_pieces`` makes them from ids.

Pipeline, one function per step:

1. ``find_answer_start``: the answer region starts at the token holding the first character
   of the marker (``CIWConfig.answer_markers``, case-insensitive, in priority order: the first
   marker that occurs anywhere wins, at its first occurrence, or its last with
   ``marker_occurrence="last"``). Everything before is reasoning.
2. ``detect_spans``: arithmetic spans (``a op b = c``, regex ``arithmetic_pattern``; a chain
   of operations without ``= c`` is read past whole) first, at most ``max_spans // 2``; then
   sentence spans that overlap no arithmetic span, until ``max_spans`` spans in all.
   Sentences partition the reasoning tokens: one ends at the token holding the last character
   of a boundary (``sentence_end_pattern``: ``.``/``!``/``?`` followed by whitespace or the
   end, or a blank line); text after the last boundary is a final sentence. A span over
   ``max_span_tokens`` tokens, a LaTeX-heavy span (share of backslashes in its text over
   ``max_backslash_frac``) and a sentence under ``min_sentence_tokens`` tokens are skipped.
   Spans are returned sorted and disjoint. Every search is linear in the text's length
   (docs/rewards.md, "Bounded work on policy text").
3. ``importance_from_drops``: every reasoning token starts at ``base_importance``; each
   span's FULL drop is added to each of its tokens (METHOD 8.4; not divided by the span
   length); then min-max rescale over the reasoning region to
   ``[importance_low, importance_high]``.
4. ``CIW_MODES[mode]``: the importance transform (``ciw``: identity; ablations below).
5. ``ciw_token_weights``: formatting tokens (stripped piece in ``formatting_tokens``) times
   ``formatting_factor``; reasoning ``w = w_min + (boost - w_min) * importance``; answer
   ``w = answer_weight``; everything else 1; optional conservation.

Choices the method leaves open (documented, and config where they are a value):

- Drop: ``sum_t log pi(a_t | full) - sum_t log pi(a_t | span masked)`` over the answer
  region's tokens; > 0 when the span helps the answer. A span with drop < 0 is a
  "distractor": masking it raises the answer's probability.
- Degenerate rescale (no span, or all raw importances equal): every reasoning token gets
  ``importance_low``; no token is singled out without evidence.
- No answer marker: the row is not reweighted (all weights 1) and costs no forward pass;
  the drop needs an answer to measure.
- Regions cover the *content* of a response: its tokens before the closing EOS. The EOS and
  right padding are neither reasoning nor answer and keep weight 1, like prompt tokens.
- Conservation rescales the content tokens of each row to mean 1; as the EOS keeps weight 1
  the mean over all of the row's response tokens is then 1 as well.
- Formatting damping applies to reasoning tokens only, after the mode's transform, so the
  ablations change the causal signal and leave the structural damping as it is.

Ablations (``CIW_MODES``, selected by ``CIWConfig.mode``):

- ``uniform``: every weight is 1 (CIW off, but the caller still runs the same scoring, so
  overhead and metrics stay comparable).
- ``random``: each reasoning token's importance is drawn uniformly from
  ``[importance_low, importance_high]`` with the given ``torch.Generator`` (seeded by the
  caller; ``CIWConfig.seed`` when none is given); answer weight and damping unchanged.
- ``inverted``: ``i -> importance_low + importance_high - i`` on reasoning tokens (1.5 - i
  with the defaults): the most important tokens get the lowest weight.

Not covered here: decoding ids into pieces and the masked forward passes (``ciw_scoring.py``),
and when to skip CIW (rows with zero advantage get no gradient whatever their weights; the
caller passes only the rows it needs scored).
"""
from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from typing import Literal, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from ibpo_lit.algorithms.registry import Registry

CIW_MODES = Registry("CIW mode")
"""``CIW_MODES[name](importance, reasoning, cfg, generator) -> importance or None``.

importance [B, T] float32 (meaningful on reasoning tokens), reasoning [B, T] bool, ``cfg`` a
``CIWConfig``, ``generator`` a ``torch.Generator`` or None. Returns the transformed
importance [B, T] (only reasoning positions are read), or None for "no reweighting: every
weight 1".
"""

_NUMBER = r"\$?\d+(?:,\d{3})*(?:\.\d+)?"
_OPERATOR = r"(?:[-+*/×÷·x]|\\times|\\cdot|\\div)"
# A number starts at its first digit (or its ``$``): not after a digit, nor at a thousands group
# (``,ddd``) of the number before it. The number's own start reads the same text to the same
# end, so nothing is lost; without this, each digit of a long run was a start that read the rest
# of the run again (quadratic).
_NUMBER_START = r"(?!(?<=\d)\d)(?!(?<=\d,)\d{3}(?!\d))"
ARITHMETIC_PATTERN = rf"{_NUMBER_START}{_NUMBER}(?:\s*{_OPERATOR}\s*{_NUMBER})+(?P<result>\s*=\s*-?{_NUMBER})?"
"""``a op b (op c ...) = d``: numbers with optional ``$``, thousands commas and decimals.

Each chain of operations is matched whole, with its ``= d`` (group ``result``) or without it; a
match without a result is read past, not a span (`detect_spans`). So the search never starts
again inside a chain: linear in the text's length. The pattern it replaces
(``...(?:op number)+\\s*=...``, tests/rewards/test_bounded_parsing.py) failed at every number
of a chain with no ``=`` after it, each time after reading the rest of the chain: quadratic."""

SENTENCE_END_PATTERN = r"[.!?](?=\s|$)|\n[ \t]*\n"
"""A sentence ends after ``.``, ``!`` or ``?`` followed by whitespace or the end of the
region (so ``3.5`` is not a boundary), or after a blank line."""

FORMATTING_TOKENS = ("#", "##", "###", "####", "=", "==", "===", "====", "-", "--", "---")


@dataclass
class CIWConfig:
    """Counterfactual importance weighting (METHOD section 8); defaults are the authors'.

    Args:
        mode: ``ciw`` (the method), or an ablation: ``uniform`` (every weight 1, same
            scoring cost), ``random`` (importance drawn uniformly in
            ``[importance_low, importance_high]``), ``inverted`` (importance
            ``i -> importance_low + importance_high - i``).
        answer_markers: Strings that open the answer region, matched case-insensitively in
            the decoded response, in priority order (the first one present wins).
        marker_occurrence: Which occurrence of the winning marker opens the answer region:
            ``first`` (the authors') or ``last``.
        max_spans: Most spans masked per response; arithmetic spans take at most half.
        min_sentence_tokens: Sentence spans shorter than this (in tokens) are skipped.
        max_span_tokens: Spans longer than this (in tokens) are skipped.
        max_backslash_frac: Spans whose text is more than this share backslashes
            (LaTeX-heavy) are skipped.
        arithmetic_pattern: Regex of an arithmetic span (``a op b = c``), searched with ``re``
            in the response's text. If it has a group named ``result``, a match in which that
            group took no part is read past, not a span (the default matches a chain of
            operations whole, with or without its result, so that the search stays linear).
            ``re`` has no timeout: a pattern of your own must be linear-time too (the trainer
            runs it on policy output; docs/rewards.md, "Bounded work on policy text").
        sentence_end_pattern: Regex whose matches end a sentence (linear-time, as above).
        mask_token: Id that replaces a masked span's tokens: ``pad`` (the tokenizer's pad
            id, EOS if it has none) or ``eos``.
        base_importance: Raw importance of every reasoning token before drops are added.
        importance_low: Lower end of the min-max rescale of importance.
        importance_high: Upper end of the min-max rescale of importance.
        formatting_tokens: Tokens (stripped of whitespace) whose importance is damped.
        formatting_factor: Importance multiplier of formatting tokens.
        w_min: Weight at importance 0: ``w = w_min + (boost - w_min) * importance``.
        boost: Weight at importance 1.
        answer_weight: Weight of every answer-region token.
        conservation: Rescale each response's weights to mean 1 (redistribute credit
            without changing the effective learning rate).
        seed: Seed of the ``random`` ablation's draws (combined with the step). Unset:
            ``seed_everything``'s (0 without it; ``ibpo_lit.seeds``).
        tokens_per_pass: Token budget of one scoring forward pass (sequences x padded
            length; under ``rollout.packing``, the sum of their lengths). Copies of several responses share a pass while they fit; all copies
            of one response are always in one pass, whatever the budget.
        cache_size: Responses whose drops are kept (keyed by prompt and response ids, for
            one policy version); 0 turns the cache off.
    """

    mode: str = "ciw"
    answer_markers: tuple[str, ...] = ("final answer", "####", "\\boxed{")
    marker_occurrence: Literal["first", "last"] = "first"
    max_spans: int = 10
    min_sentence_tokens: int = 5
    max_span_tokens: int = 50
    max_backslash_frac: float = 0.3
    arithmetic_pattern: str = ARITHMETIC_PATTERN
    sentence_end_pattern: str = SENTENCE_END_PATTERN
    mask_token: Literal["pad", "eos"] = "pad"
    base_importance: float = 0.2
    importance_low: float = 0.5
    importance_high: float = 1.0
    formatting_tokens: tuple[str, ...] = FORMATTING_TOKENS
    formatting_factor: float = 0.1
    w_min: float = 0.5
    boost: float = 2.0
    answer_weight: float = 1.5
    conservation: bool = False
    seed: Optional[int] = None
    tokens_per_pass: int = 8192
    cache_size: int = 4096

    def __post_init__(self) -> None:
        CIW_MODES.get(self.mode)  # raises, listing the valid names
        self.answer_markers = tuple(self.answer_markers)
        self.formatting_tokens = tuple(self.formatting_tokens)
        if not self.answer_markers or not all(isinstance(m, str) and m for m in self.answer_markers):
            raise ValueError(f"ciw.answer_markers must be non-empty strings, got {self.answer_markers!r}")
        if self.marker_occurrence not in ("first", "last"):
            raise ValueError(f"ciw.marker_occurrence must be 'first' or 'last', got {self.marker_occurrence!r}")
        if self.mask_token not in ("pad", "eos"):
            raise ValueError(f"ciw.mask_token must be 'pad' or 'eos', got {self.mask_token!r}")
        for name in ("max_spans", "min_sentence_tokens", "max_span_tokens", "tokens_per_pass"):
            if getattr(self, name) < 1:
                raise ValueError(f"ciw.{name} must be >= 1, got {getattr(self, name)}")
        if self.cache_size < 0:
            raise ValueError(f"ciw.cache_size must be >= 0, got {self.cache_size}")
        if not 0.0 <= self.max_backslash_frac <= 1.0:
            raise ValueError(f"ciw.max_backslash_frac must be in [0, 1], got {self.max_backslash_frac}")
        for name in ("arithmetic_pattern", "sentence_end_pattern"):
            try:
                re.compile(getattr(self, name))
            except re.error as err:
                raise ValueError(f"ciw.{name} is not a valid regex: {err}") from None
        if not math.isfinite(self.base_importance):
            raise ValueError(f"ciw.base_importance must be finite, got {self.base_importance}")
        if not 0.0 <= self.importance_low < self.importance_high:
            raise ValueError(
                "ciw.importance_low and ciw.importance_high must satisfy 0 <= low < high, got "
                f"{self.importance_low}, {self.importance_high}"
            )
        if not 0.0 <= self.formatting_factor <= 1.0:
            raise ValueError(f"ciw.formatting_factor must be in [0, 1], got {self.formatting_factor}")
        if not 0.0 <= self.w_min <= self.boost:
            raise ValueError(
                f"ciw.w_min and ciw.boost must satisfy 0 <= w_min <= boost, got {self.w_min}, {self.boost}"
            )
        if self.answer_weight < 0:
            raise ValueError(f"ciw.answer_weight must be >= 0, got {self.answer_weight}")


class Span(NamedTuple):
    """Half-open token range ``[start, end)`` of a response, and how it was found."""

    start: int
    end: int
    kind: str  # "arithmetic" or "sentence"


@dataclass(frozen=True)
class ResponseLayout:
    """Regions, spans and formatting tokens of one response (token indices from its start)."""

    length: int  # content tokens: the response before its closing EOS
    answer_start: int | None  # first answer-region token; None = no marker, no reweighting
    spans: tuple[Span, ...]  # in the reasoning region [0, answer_start), sorted, disjoint
    formatting: tuple[bool, ...]  # [length] True on formatting tokens

    @property
    def reasoning_length(self) -> int:
        return 0 if self.answer_start is None else self.answer_start


# ------------------------------------------------------------------ text <-> tokens
def _char_ends(pieces: Sequence[str]) -> list[int]:
    """[n] exclusive end offset of each token's text in ``"".join(pieces)``."""
    ends, pos = [], 0
    for piece in pieces:
        pos += len(piece)
        ends.append(pos)
    return ends


def _token_range(ends: list[int], start_char: int, end_char: int) -> tuple[int, int]:
    """Tokens ``[lo, hi)`` covering characters ``[start_char, end_char)`` (non-empty).

    ``lo`` is the token holding ``start_char``, moved back over zero-length tokens just
    before it (the leading bytes of a character split over tokens); ``hi - 1`` the token
    holding ``end_char - 1``."""
    lo = bisect.bisect_right(ends, start_char)
    while lo > 0 and ends[lo - 1] == start_char and (ends[lo - 2] if lo >= 2 else 0) == start_char:
        lo -= 1
    hi = bisect.bisect_right(ends, end_char - 1) + 1
    return lo, hi


def find_answer_start(pieces: Sequence[str], cfg: CIWConfig) -> int | None:
    """Index of the token where the answer region starts, or None without a marker.

    Each marker is a literal: one scan of the text per marker, keeping only the first or the
    last occurrence (a text of many markers costs no list of them)."""
    text = "".join(pieces)
    for marker in cfg.answer_markers:
        match = None
        for match in re.finditer(re.escape(marker), text, flags=re.IGNORECASE):
            if cfg.marker_occurrence == "first":
                break
        if match is not None:
            return _token_range(_char_ends(pieces), match.start(), match.end())[0]
    return None


def _latex_heavy(pieces: Sequence[str], start: int, end: int, cfg: CIWConfig) -> bool:
    text = "".join(pieces[start:end])
    return bool(text) and text.count("\\") / len(text) > cfg.max_backslash_frac


def _sentence_ranges(pieces: Sequence[str], ends: list[int], cfg: CIWConfig) -> list[tuple[int, int]]:
    """Partition of tokens ``[0, len(pieces))`` into sentences."""
    text = "".join(pieces)
    cuts = []
    for match in re.finditer(cfg.sentence_end_pattern, text):
        if match.end() > match.start():
            cut = bisect.bisect_right(ends, match.end() - 1) + 1  # after the token holding the last char
            if not cuts or cut > cuts[-1]:
                cuts.append(cut)
    if not cuts or cuts[-1] < len(pieces):
        cuts.append(len(pieces))
    return list(zip([0] + cuts[:-1], cuts))


def detect_spans(pieces: Sequence[str], cfg: CIWConfig) -> list[Span]:
    """Spans of a reasoning region given as its pieces [R]: arithmetic first (at most
    ``max_spans // 2``), then sentences, at most ``max_spans`` in all; sorted by start."""
    text = "".join(pieces)
    ends = _char_ends(pieces)

    def acceptable(start: int, end: int) -> bool:
        return 0 < end - start <= cfg.max_span_tokens and not _latex_heavy(pieces, start, end, cfg)

    arithmetic: list[Span] = []
    pattern = re.compile(cfg.arithmetic_pattern)
    result = pattern.groupindex.get("result")
    for match in pattern.finditer(text):
        if len(arithmetic) >= cfg.max_spans // 2:
            break
        if match.end() == match.start() or (result is not None and match.start(result) < 0):
            continue  # empty, or a chain of operations without its "= result": read past
        start, end = _token_range(ends, match.start(), match.end())
        overlaps = bool(arithmetic) and start < arithmetic[-1].end  # BPE: two matches in one token
        if acceptable(start, end) and not overlaps:
            arithmetic.append(Span(start, end, "arithmetic"))

    spans = list(arithmetic)
    for start, end in _sentence_ranges(pieces, ends, cfg):
        if len(spans) >= cfg.max_spans:
            break
        if end - start < cfg.min_sentence_tokens or not acceptable(start, end):
            continue
        if any(start < a.end and a.start < end for a in arithmetic):
            continue
        spans.append(Span(start, end, "sentence"))
    return sorted(spans)


def layout_response(pieces: Sequence[str], cfg: CIWConfig, tool: Sequence[bool] | None = None) -> ResponseLayout:
    """Regions, spans and formatting flags of a response's content pieces [n] (its tokens
    before the closing EOS).

    ``tool`` [n]: True on tool-output tokens (tool-integrated rollouts). They are not reasoning:
    their text is blanked before the search (an answer marker or a sentence printed by a program
    is not the policy's), and no span holds one. (A masked copy keeps the tool's output as it
    was: the counterfactual is the policy's text only.)"""
    if tool is not None and any(tool):
        if len(tool) != len(pieces):
            raise ValueError(f"layout_response: {len(pieces)} pieces but {len(tool)} tool flags")
        pieces = [" " * len(p) if t else p for p, t in zip(pieces, tool)]
    answer_start = find_answer_start(pieces, cfg)
    spans = () if answer_start is None else tuple(detect_spans(pieces[:answer_start], cfg))
    if tool is not None and any(tool):
        spans = tuple(s for s in spans if not any(tool[s.start:s.end]))
    formatting = tuple(piece.strip() in cfg.formatting_tokens for piece in pieces)
    return ResponseLayout(len(pieces), answer_start, spans, formatting)


# ------------------------------------------------------------------ importance and weights
def importance_from_drops(
    reasoning_length: int, spans: Sequence[Span | tuple[int, int]], drops: Sequence[float], cfg: CIWConfig
) -> Tensor:
    """[R] float32 importance of the reasoning tokens, in ``[importance_low, importance_high]``.

    ``raw_t = base_importance + sum of the drops of the spans holding t``, min-max rescaled;
    all ``importance_low`` when every ``raw_t`` is equal (for example: no span)."""
    if len(spans) != len(drops):
        raise ValueError(f"importance_from_drops: {len(spans)} spans but {len(drops)} drops")
    raw = torch.full((reasoning_length,), float(cfg.base_importance), dtype=torch.float64)
    for span, drop in zip(spans, drops):
        raw[span[0] : span[1]] += float(drop)
    low, high = cfg.importance_low, cfg.importance_high
    if reasoning_length == 0 or not bool(raw.max() > raw.min()):
        return torch.full((reasoning_length,), float(low), dtype=torch.float32)
    scaled = (raw - raw.min()) / (raw.max() - raw.min())
    return (low + (high - low) * scaled).float()


@CIW_MODES.register("ciw")
def ciw_importance(importance: Tensor, reasoning: Tensor, cfg: CIWConfig, generator=None) -> Tensor:
    """The method: importance as measured."""
    return importance


@CIW_MODES.register("uniform")
def uniform_importance(importance: Tensor, reasoning: Tensor, cfg: CIWConfig, generator=None) -> None:
    """Ablation: no reweighting at all (every weight 1)."""
    return None


@CIW_MODES.register("random")
def random_importance(
    importance: Tensor, reasoning: Tensor, cfg: CIWConfig, generator: torch.Generator | None = None
) -> Tensor:
    """Ablation: reasoning importance ~ U[importance_low, importance_high], i.i.d. per token,
    drawn on the CPU from ``generator`` (a fresh one seeded with ``cfg.seed``, 0 when unset, when None)."""
    if generator is None:
        generator = torch.Generator().manual_seed(0 if cfg.seed is None else cfg.seed)
    draws = torch.rand(importance.shape, generator=generator, dtype=torch.float32)
    draws = cfg.importance_low + (cfg.importance_high - cfg.importance_low) * draws
    return torch.where(reasoning.cpu(), draws, importance.float().cpu()).to(importance.device)


@CIW_MODES.register("inverted")
def inverted_importance(importance: Tensor, reasoning: Tensor, cfg: CIWConfig, generator=None) -> Tensor:
    """Ablation: ``i -> low + high - i`` on reasoning tokens (the most important get least)."""
    flipped = cfg.importance_low + cfg.importance_high - importance.float()
    return torch.where(reasoning, flipped, importance.float())


def conserve_mean(weights: Tensor, content: Tensor) -> Tensor:
    """Rescale each row's weights on ``content`` [B, T] bool to mean 1 there; rows without
    content (or with a zero mean) are left as they are."""
    count = content.sum(-1, keepdim=True)
    mean = torch.where(content, weights, 0.0).sum(-1, keepdim=True) / count.clamp_min(1)
    scale = torch.where((count > 0) & (mean > 0), 1.0 / mean, torch.ones_like(mean))
    return torch.where(content, weights * scale, weights)


def ciw_token_weights(
    importance: Tensor,
    reasoning: Tensor,
    answer: Tensor,
    formatting: Tensor,
    cfg: CIWConfig,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Token weights [B, T] float32 from importance (METHOD 8.5).

    Args:
        importance: [B, T] float, read on reasoning tokens (from ``importance_from_drops``).
        reasoning: [B, T] bool, reasoning-region tokens.
        answer: [B, T] bool, answer-region tokens (disjoint from ``reasoning``).
        formatting: [B, T] bool, formatting tokens (damped where also reasoning).
        cfg: ``mode`` picks the transform in ``CIW_MODES``; the weight constants.
        generator: for the ``random`` ablation.

    Returns:
        [B, T] float32: reasoning ``w_min + (boost - w_min) * importance`` (formatting
        tokens' importance times ``formatting_factor``), answer ``answer_weight``, elsewhere
        1; each row rescaled to mean 1 over reasoning + answer with ``conservation``.
    """
    importance = CIW_MODES.get(cfg.mode)(importance.float(), reasoning, cfg, generator)
    if importance is None:
        return torch.ones(reasoning.shape, dtype=torch.float32, device=reasoning.device)
    importance = torch.where(formatting & reasoning, importance * cfg.formatting_factor, importance)
    weights = torch.where(reasoning, cfg.w_min + (cfg.boost - cfg.w_min) * importance, 1.0)
    weights = torch.where(answer, float(cfg.answer_weight), weights)
    if cfg.conservation:
        weights = conserve_mean(weights, reasoning | answer)
    return weights.float()


def layout_masks(layouts: Sequence[ResponseLayout], width: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(reasoning, answer, formatting)`` [B, width] bool masks of responses' layouts."""
    reasoning = torch.zeros(len(layouts), width, dtype=torch.bool)
    answer = torch.zeros_like(reasoning)
    formatting = torch.zeros_like(reasoning)
    for row, layout in enumerate(layouts):
        if layout.length > width:
            raise ValueError(f"layout of row {row} has {layout.length} tokens; width is {width}")
        formatting[row, : layout.length] = torch.tensor(layout.formatting, dtype=torch.bool)
        if layout.answer_start is not None:
            reasoning[row, : layout.answer_start] = True
            answer[row, layout.answer_start : layout.length] = True
    return reasoning, answer, formatting


def layout_weights(
    layouts: Sequence[ResponseLayout],
    drops: Sequence[Sequence[float]],
    width: int,
    cfg: CIWConfig,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Token weights [B, width] float32 of responses from their layouts and span drops
    (``drops[b]`` one float per ``layouts[b].spans``). Rows without a marker get 1."""
    if len(layouts) != len(drops):
        raise ValueError(f"layout_weights: {len(layouts)} layouts but {len(drops)} drop lists")
    reasoning, answer, formatting = layout_masks(layouts, width)
    importance = torch.zeros(len(layouts), width, dtype=torch.float32)
    for row, (layout, row_drops) in enumerate(zip(layouts, drops)):
        r = layout.reasoning_length
        importance[row, :r] = importance_from_drops(r, layout.spans, row_drops, cfg)
    return ciw_token_weights(importance, reasoning, answer, formatting, cfg, generator)


def ciw_metrics(
    layouts: Sequence[ResponseLayout], drops: Sequence[Sequence[float]], weights: Tensor
) -> dict[str, float]:
    """``ciw/`` metrics of scored responses (weights [B, T] as returned for them).

    ``spans_per_rollout`` and ``marker_frac`` average over the responses given;
    ``weight_reasoning`` / ``weight_answer`` are token means over all responses' regions;
    ``distractor_frac`` is the share of spans with drop < 0 and ``drop_mean`` their mean
    drop. Means over an empty set are NaN (nothing to measure, not 0)."""
    n = len(layouts)
    reasoning, answer, _ = layout_masks(layouts, weights.shape[1])
    all_drops = [float(d) for row in drops for d in row]
    nan = float("nan")

    def masked_mean(mask: Tensor) -> float:
        return float(weights[mask].float().mean()) if mask.any() else nan

    return {
        "ciw/spans_per_rollout": sum(len(l.spans) for l in layouts) / n if n else nan,
        "ciw/marker_frac": sum(l.answer_start is not None for l in layouts) / n if n else nan,
        "ciw/weight_reasoning": masked_mean(reasoning),
        "ciw/weight_answer": masked_mean(answer),
        "ciw/distractor_frac": sum(d < 0 for d in all_drops) / len(all_drops) if all_drops else nan,
        "ciw/drop_mean": sum(all_drops) / len(all_drops) if all_drops else nan,
    }
