"""Math answer verification with math-verify: strings in, a score (or None) out.

What is covered:
- GSM8K gold extraction (`extract_gsm8k_gold`): the text after the last ``####``, thousands
  separators removed.
- `math_score_inprocess(completion, gold)`: 1.0 if the completion's final answer equals the gold
  (symbolically or numerically, via math-verify), 0.0 if it does not or if the completion gives
  no answer, and None when the pair cannot be scored (the gold does not parse, or math-verify
  raises). It runs in the calling process with no time limit. It is what ``REWARDS["math"]``
  names, so it is what `RewardPool` workers run.
- With a hard timeout: `ibpo_lit.rewards.math_pool` (`math_score`, `math_scores`), or a
  `RewardPool("math")` of your own; training and evaluation use the math task's pool
  (``ibpo_lit.tasks``).
- Where the completion's answer is read from: our prompts ask for the answer after ``####``
  (GSM8K style), so when a completion contains ``####`` the first line after the last ``####`` is
  what is parsed. Otherwise math-verify's default extraction over the whole completion applies
  (an answer phrase such as "the final answer is", the last ``\\boxed{}``, the last number).
  A ``####`` line with nothing parseable falls back to the default extraction too.
- **A computation left undone is not an answer.** math-verify evaluates expressions, so on its
  own it scores "#### 47 * 83" (or "47 * 83 = ####") as right for the gold 3901: a policy
  trained on arithmetic learns to restate the question as its answer (found here: SmolLM2 runs
  on the arithmetic task went to 6-token responses and 100% reward). When the gold is a plain
  number, an answer that is arithmetic on numbers (``+``, ``-`` between terms, a product of two
  numbers, a power such as ``10^3``) scores 0.0; a written value still counts: integers,
  decimals, ``-12``, ``3/4``, ``\\frac{3}{4}``, ``50%``. Golds that are expressions (``2^{10}``,
  ``\\sqrt{2}``) keep math-verify's equivalence unchanged.
- The gold is parsed as LaTeX (wrapped in ``$...$``), so "72", "1,080", "\\frac12" and
  "\\sqrt{\\frac{95}{24}}" all parse. A gold that yields no mathematical object (empty, or
  malformed LaTeX such as "\\frac{") is unscorable: None, never a silent 0. A gold of another
  kind (a code test spec, a tool call's spec: ``ibpo_lit.rewards.gold_kinds``) is not an
  answer at all: `GoldKindError`, a data error.

What is not covered:
- Timeouts inside `math_score_inprocess`. math-verify's own timeouts use SIGALRM, which only
  works in the main thread (and cannot interrupt a long C call), so they are switched off here
  (``parsing_timeout=None``, ``timeout_seconds=None``): a pathological expression can take
  arbitrarily long in sympy. The hard limit is the pool's, which kills the worker
  (`ibpo_lit.rewards.pool`).
- Multiple-choice letters and free-text answers (math-verify's `StringExtractionConfig`).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from sympy import Basic, Integer, Mul, Number, Pow, Rational, UnevaluatedExpr

from ibpo_lit.rewards.gold_kinds import ANSWER, check_kind

logger = logging.getLogger(__name__)

GSM8K_MARKER = "####"

# Completion extraction: LaTeX (boxed, $...$) first, then plain expressions / numbers; gold: LaTeX.
# math-verify itself is imported where it parses (`_configs`): reading data (GSM8K golds) and the
# command line's start need none of its LaTeX grammar (a quarter of a second to import).
_COMPLETION, _GOLD = "completion", "gold"


def _configs(which: str) -> tuple:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return (LatexExtractionConfig(), ExprExtractionConfig()) if which == _COMPLETION else (LatexExtractionConfig(),)

RewardFn = Callable[[str, str], "float | None"]

DEFAULT_TIMEOUT_S = 5.0  # hard per-item limit of `math_score` / `math_scores`


def _drop_timeout_disabled_warning(record: logging.LogRecord) -> bool:
    # math-verify warns on every call that its timeouts are off; they are off on purpose here
    # (the pool enforces the limit), and each pool worker would repeat the warning.
    return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_drop_timeout_disabled_warning)


def extract_gsm8k_gold(answer: str) -> str:
    """The final answer of a GSM8K solution: text after the last ``####``, commas removed.

    Raises:
        ValueError: if ``answer`` has no ``####``.
    """
    if GSM8K_MARKER not in answer:
        raise ValueError(f"no {GSM8K_MARKER!r} in answer: {answer[-80:]!r}")
    return answer.rsplit(GSM8K_MARKER, 1)[1].replace(",", "").strip()


def _parse(text: str, which: str, parsing_timeout: int | None = None) -> list:
    from math_verify import parse

    return parse(text, extraction_config=_configs(which), parsing_timeout=parsing_timeout, raise_on_error=True)


def parse_completion(completion: str, parsing_timeout: int | None = None) -> list:
    """math-verify's parse of a completion's final answer: the first line after the last
    ``####`` when it parses, else math-verify's default extraction over the whole text.
    The one rule for where an answer is read from (scoring and majority voting share it).
    ``parsing_timeout`` (SIGALRM) works only in the main thread; raises on parser errors."""
    if GSM8K_MARKER in completion:
        tail = completion.rsplit(GSM8K_MARKER, 1)[1].strip()
        line = tail.splitlines()[0] if tail else ""
        parsed = _parse(line, _COMPLETION, parsing_timeout) if line else []
        if parsed:
            return parsed
    return _parse(completion, _COMPLETION, parsing_timeout)


def is_written_value(expr) -> bool:
    """Whether a parsed answer is a number as written, not arithmetic still to do.

    Values: a number (``Integer``, ``Rational``, ``Float``), ``1/b`` and ``a/b`` written with a
    slash (``Pow(b, -1)``, ``Mul(a, Pow(b, -1))``), a percentage (math-verify's
    ``Mul(a, UnevaluatedExpr(1/100))``), each with an optional minus sign. Not values: sums and
    differences, products of two numbers, powers (``47*83``, ``2+3``, ``7-2``, ``10^3``).
    math-verify keeps what it parses unevaluated, which is what makes the difference visible.
    """
    if isinstance(expr, Number):
        return True
    if isinstance(expr, Pow):
        return isinstance(expr.base, Integer) and expr.exp == -1
    if isinstance(expr, UnevaluatedExpr):
        return expr.args[0] == Rational(1, 100)  # the % sign
    if isinstance(expr, Mul):
        args = list(expr.args)
        if args and args[0] == -1:  # a minus sign
            args = args[1:]
        numbers = sum(isinstance(a, Number) for a in args)
        divisors = sum(isinstance(a, Pow) for a in args)
        return bool(args) and all(is_written_value(a) for a in args) and numbers <= 1 and divisors <= 1
    return False


def _unfinished_arithmetic(answer: list, gold: list) -> bool:
    """The gold is a number and the answer is arithmetic on numbers, not a number."""
    value, target = answer[0], next(g for g in gold if not isinstance(g, str))
    return (
        isinstance(target, Number)
        and isinstance(value, Basic)
        and not getattr(value, "free_symbols", True)
        and not is_written_value(value)
    )


def math_score_inprocess(completion: str, gold: str) -> float | None:
    """Score a completion against a gold answer, in this process, with no time limit.

    This is ``REWARDS["math"]``, what `RewardPool` workers call. Call `math_score` (hard
    timeout) from the trainer instead: this one can hang on adversarial LaTeX.

    Args:
        completion: the model's response text.
        gold: the gold final answer, plain or LaTeX ("72", "\\frac{1}{2}").

    Returns:
        1.0 or 0.0; None if the pair cannot be scored (gold unparseable, math-verify error).

    Raises:
        GoldKindError: a gold that is not an answer (a code test spec, a tool call's spec).
    """
    from math_verify import verify

    check_kind("math", gold, math_score_inprocess.gold_kinds)
    try:
        gold_parsed = _parse(f"${gold}$", _GOLD) if gold.strip() else []
        if not any(not isinstance(g, str) for g in gold_parsed):  # only a raw-string fallback
            logger.debug("gold does not parse: %r", gold)
            return None
        answer = parse_completion(completion)
        if not answer or _unfinished_arithmetic(answer, gold_parsed):
            return 0.0
        ok = verify(gold_parsed, answer, timeout_seconds=None, raise_on_error=True)
    except Exception:  # math-verify / sympy / latex2sympy errors: unscorable, not wrong
        logger.debug("math-verify failed on completion %r, gold %r", completion[-200:], gold, exc_info=True)
        return None
    return 1.0 if ok else 0.0


math_score_inprocess.gold_kinds = (ANSWER,)  # a final answer; a sandbox spec is no answer
