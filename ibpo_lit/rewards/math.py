"""Math answer verification with math-verify: strings in, a score (or None) out.

What is covered:
- GSM8K gold extraction (`extract_gsm8k_gold`): the text after the last ``####``, thousands
  separators removed.
- `math_score(completion, gold)`: 1.0 if the completion's final answer equals the gold
  (symbolically or numerically, via math-verify), 0.0 if it does not or if the completion gives
  no answer, and None when the pair cannot be scored (the gold does not parse, or math-verify
  raises).
- Where the completion's answer is read from: our prompts ask for the answer after ``####``
  (GSM8K style), so when a completion contains ``####`` the first line after the last ``####`` is
  what is parsed. Otherwise math-verify's default extraction over the whole completion applies
  (an answer phrase such as "the final answer is", the last ``\\boxed{}``, the last number).
  A ``####`` line with nothing parseable falls back to the default extraction too.
- The gold is parsed as LaTeX (wrapped in ``$...$``), so "72", "1,080", "\\frac12" and
  "\\sqrt{\\frac{95}{24}}" all parse. A gold that yields no mathematical object (empty, or
  malformed LaTeX such as "\\frac{") is unscorable: None, never a silent 0.

What is not covered:
- Timeouts. math-verify's own timeouts use SIGALRM, which only works in the main thread, so they
  are switched off here (``parsing_timeout=None``, ``timeout_seconds=None``) and `math_score`
  works from any thread. A pathological expression can therefore take long in sympy; a hard,
  process-level timeout (kill the worker) is a later issue.
- Multiple-choice letters and free-text answers (math-verify's `StringExtractionConfig`).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

logger = logging.getLogger(__name__)

GSM8K_MARKER = "####"

# Completion extraction: LaTeX (boxed, $...$) first, then plain expressions / numbers.
_COMPLETION_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_GOLD_CONFIG = (LatexExtractionConfig(),)

RewardFn = Callable[[str, str], "float | None"]


def extract_gsm8k_gold(answer: str) -> str:
    """The final answer of a GSM8K solution: text after the last ``####``, commas removed.

    Raises:
        ValueError: if ``answer`` has no ``####``.
    """
    if GSM8K_MARKER not in answer:
        raise ValueError(f"no {GSM8K_MARKER!r} in answer: {answer[-80:]!r}")
    return answer.rsplit(GSM8K_MARKER, 1)[1].replace(",", "").strip()


def _parse(text: str, config) -> list:
    return parse(text, extraction_config=config, parsing_timeout=None, raise_on_error=True)


def _parse_completion(completion: str) -> list:
    if GSM8K_MARKER in completion:
        tail = completion.rsplit(GSM8K_MARKER, 1)[1].strip()
        line = tail.splitlines()[0] if tail else ""
        parsed = _parse(line, _COMPLETION_CONFIG) if line else []
        if parsed:
            return parsed
    return _parse(completion, _COMPLETION_CONFIG)


def math_score(completion: str, gold: str) -> float | None:
    """Score a completion against a gold answer: 1.0 correct, 0.0 wrong or no answer.

    Args:
        completion: the model's response text.
        gold: the gold final answer, plain or LaTeX ("72", "\\frac{1}{2}").

    Returns:
        1.0 or 0.0; None if the pair cannot be scored (gold unparseable, math-verify error).
    """
    try:
        gold_parsed = _parse(f"${gold}$", _GOLD_CONFIG) if gold.strip() else []
        if not any(not isinstance(g, str) for g in gold_parsed):  # only a raw-string fallback
            logger.debug("gold does not parse: %r", gold)
            return None
        answer = _parse_completion(completion)
        if not answer:
            return 0.0
        ok = verify(gold_parsed, answer, timeout_seconds=None, raise_on_error=True)
    except Exception:  # math-verify / sympy / latex2sympy errors: unscorable, not wrong
        logger.debug("math-verify failed on completion %r, gold %r", completion[-200:], gold, exc_info=True)
        return None
    return 1.0 if ok else 0.0
