"""Untrusted text stays text: the token ids of prompts that quote what a model did not write as
control.

Text the policy wrote, a tool printed or a record holds is decoded to a string and placed in a
prompt for a model: IBPO's correction prompt, a judge's question, a reward model's input, a tool
turn, the training and evaluation prompts. Tokenized as usual, a special token written in that
text (``<|im_end|>\\n<|im_start|>system\\n``) is parsed into the control token itself, and the
text closes its turn and opens another (issue 43). Every site that tokenizes such a prompt calls
this module, so the rule holds by construction: **only a chat template writes control tokens**;
text is tokenized with special tokens split (``split_special_tokens=True``: ``<|im_end|>``
becomes the ordinary tokens of its characters, as if the policy had typed them).

What is covered:
    * `text_ids`: a text alone, no special token added (a tool turn, a piece cut from a text).
    * `plain_ids`: a prompt without a chat template: all of it is text; the special tokens the
      tokenizer adds of its own (a BOS from its post-processor) are real.
    * `chat_ids`: messages in the tokenizer's chat template. Every message's content is text,
      whoever wrote it (the record, the policy, a program, the configuration's system prompt and
      instruction); the template's own tokens around the contents are parsed as usual. How: each
      special token's string inside a content is replaced by a marker (private-use characters
      around an index; a content's own private-use opening character is escaped the same way, so
      no text can forge a marker), the template is rendered, the text between markers is
      tokenized as usual and each marker becomes its string's split ids. So a text without special tokens
      gets exactly the ids it always had, and the template's own handling of contents (Qwen3
      moving an assistant turn's ``<think>`` into its reasoning block, Llama 3 trimming) applies.
      Two checks on every call: the rendered text, markers put back, is the template's own
      rendering of the messages (the template passed every marker through unchanged), and the
      special tokens of the result are, in order, those of the template rendered around
      placeholder contents (no special token formed across a content's edge). Where either
      fails, the ids are spliced instead: the template rendered with placeholders, its parts
      tokenized as usual and each content's split ids put at its placeholder (content as
      written, the template's handling of it not applied; logged once at WARNING).
    * A tokenizer that cannot split (one whose text ids would still hold a special token) raises
      `UntrustedTextError` instead of letting a control token through.

What is not covered:
    * Added tokens that are not special (Qwen3's ``<think>``, ``<tool_call>``): vocabulary the
      policy writes as ordinary tokens; they stay single tokens, as ``split_special_tokens``
      leaves them. The unknown token is text too (a character outside the vocabulary).
    * What a text says: a response may still argue with its judge in words (docs/sandbox.md).
    * Contents that are not strings (multimodal parts) are refused.
"""
from __future__ import annotations

import functools
import logging
import re
import weakref
from typing import Any, Sequence

logger = logging.getLogger(__name__)

# Markers: private-use characters around an index. A content's own "\ue000" is escaped as a
# special token's string is, so every "\ue000" in a rendering is a marker of this module's.
_OPEN, _CLOSE = "\ue000", "\ue001"
_PLACEHOLDER = re.compile(f"{_OPEN}#(\\d+){_CLOSE}")  # a message's content, in `_skeleton`
_MARKER = re.compile(f"{_OPEN}\\.(\\d+){_CLOSE}")  # an escaped string, in `_escaped`
_warned_splice = False
_skeletons: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {structure: skeleton}


class UntrustedTextError(ValueError):
    """A tokenizer that cannot keep a special token's string as text."""


def special_strings(tokenizer) -> tuple[str, ...]:
    """The strings the tokenizer parses as special tokens, longest first."""
    found = {t.content for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()
             if getattr(t, "special", False)}
    found.update(getattr(tokenizer, "all_special_tokens", None) or ())
    return tuple(sorted((s for s in found if s), key=lambda s: (-len(s), s)))


def control_ids(tokenizer) -> frozenset[int]:
    """The ids of the tokenizer's special tokens, but for the unknown token (text outside the
    vocabulary is tokenized to it whatever its origin)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids = {i for i, t in added.items() if getattr(t, "special", False)}
    ids.update(getattr(tokenizer, "all_special_ids", None) or ())
    ids.discard(getattr(tokenizer, "unk_token_id", None))
    return frozenset(ids)


def text_ids(tokenizer, text: str) -> list[int]:
    """``text`` as ordinary tokens: its special tokens' strings split, none added."""
    ids = list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    _check_text(tokenizer, ids, control_ids(tokenizer))
    return ids


def plain_ids(tokenizer, text: str) -> list[int]:
    """A prompt without a chat template: ``text`` as text, with the special tokens the tokenizer
    adds of its own (a BOS), as ``tokenizer(text)`` would add them."""
    ids = list(tokenizer(text, add_special_tokens=True, split_special_tokens=True)["input_ids"])
    controls = control_ids(tokenizer)
    added = [i for i in tokenizer("", add_special_tokens=True)["input_ids"] if i in controls]
    if [i for i in ids if i in controls] != added:
        raise _cannot_split(tokenizer)
    return ids


def chat_ids(tokenizer, messages: Sequence[dict], **options: Any) -> list[int]:
    """``messages`` in the tokenizer's chat template, every content as text (module docstring).

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template.
        messages: ``[{"role": ..., "content": str}, ...]``.
        options: ``apply_chat_template``'s: ``add_generation_prompt``, ``continue_final_message``,
            the template's own variables (Qwen3's ``enable_thinking``).
    """
    for message in messages:
        if not isinstance(message.get("content"), str):
            raise TypeError(f"a message's content must be a string, got {type(message.get('content')).__name__}")
    controls = control_ids(tokenizer)
    parts, holes = _skeleton(tokenizer, messages, options)
    expected = [i for part in parts for i in part if i in controls]
    ids = _escaped(tokenizer, messages, options)
    if ids is not None and [i for i in ids if i in controls] == expected:
        return ids
    _warn_splice(tokenizer)
    out: list[int] = []
    for k, part in enumerate(parts):
        out += list(part)
        if k < len(holes):
            content = messages[holes[k]]["content"]
            # transformers cuts the spaces at the end of a message it continues
            last = options.get("continue_final_message") and holes[k] == len(messages) - 1
            out += text_ids(tokenizer, content.rstrip() if last else content)
    return out


# ---------------------------------------------------------------- how
def _render(tokenizer, messages, options) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, **options)


def _skeleton(tokenizer, messages, options) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """The template rendered around placeholder contents: its parts' ids (special tokens parsed)
    and, between part k and k+1, which message's content goes there. The same for every call
    with the same roles and options (contents do not enter it), so it is kept per tokenizer."""
    key = (repr(tokenizer.chat_template), len(tokenizer), repr(sorted(options.items())),
           tuple(repr(sorted((k, v) for k, v in m.items() if k != "content")) for m in messages))
    cache = _skeletons.setdefault(tokenizer, {})
    if key not in cache:
        holders = [dict(m, content=f"{_OPEN}#{k}{_CLOSE}") for k, m in enumerate(messages)]
        pieces = _PLACEHOLDER.split(_render(tokenizer, holders, options))
        texts = pieces[0::2]
        ids = tokenizer([t for t in texts if t], add_special_tokens=False)["input_ids"] if any(texts) else []
        it = iter(ids)
        parts = tuple(tuple(next(it)) if t else () for t in texts)
        if len(cache) >= 64:
            cache.clear()
        cache[key] = parts, tuple(int(k) for k in pieces[1::2])
    return cache[key]


@functools.lru_cache(maxsize=64)
def _specials_pattern(specials: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(re.escape(s) for s in specials))


def _escaped(tokenizer, messages, options) -> list[int] | None:
    """The template's own rendering with each special token's string in a content tokenized as
    text; None when the template did not pass the markers through unchanged."""
    table: list[str] = []

    def mark(match: re.Match) -> str:
        table.append(match.group(0))
        return f"{_OPEN}.{len(table) - 1}{_CLOSE}"

    pattern = _specials_pattern(special_strings(tokenizer) + (_OPEN,))
    escaped = [dict(m, content=pattern.sub(mark, m["content"])) for m in messages]
    rendered = _render(tokenizer, escaped, options)
    pieces = _MARKER.split(rendered)
    restored = "".join(table[int(p)] if i % 2 else p for i, p in enumerate(pieces))
    if table and restored != _render(tokenizer, messages, options):
        return None
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if i % 2:
            ids += text_ids(tokenizer, table[int(piece)])
        elif piece:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
    return ids


def _check_text(tokenizer, ids: list[int], controls: frozenset[int]) -> None:
    if any(i in controls for i in ids):
        raise _cannot_split(tokenizer)


def _cannot_split(tokenizer) -> UntrustedTextError:
    return UntrustedTextError(
        f"{type(tokenizer).__name__} turned text into special tokens even with split_special_tokens=True; "
        "untrusted text cannot be shown to a model with it (use a fast tokenizer: AutoTokenizer's default)")


def _warn_splice(tokenizer) -> None:
    global _warned_splice
    level = logging.DEBUG if _warned_splice else logging.WARNING
    _warned_splice = True
    logger.log(level, "%s's chat template changes message contents in a way the markers of untrusted text do not "
               "survive, or text formed a special token across a content's edge: the contents are spliced in as "
               "written, as text, without the template's handling of them; later cases are logged at DEBUG",
               getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__)
