"""The final answer of a completion, as a string on which equivalent answers agree (for maj@k).

What is covered:
- Where the answer is read from, as ``ibpo_lit.rewards.math_score`` reads it: the first line
  after the last ``####`` when there is one and it parses, else math-verify's default
  extraction over the whole completion (the last ``\\boxed{}``, an answer phrase, the last number).
- The canonical string: math-verify's ``parse`` returns ``[sympy object, source string]``; we
  take the first result (the sympy object), evaluate it (``doit()``: latex2sympy leaves
  ``2/4`` and ``1/\\sqrt{2}`` unevaluated), turn floats into exact rationals (``nsimplify(...,
  rational=True)``) and print it with ``sympy.sstr``. So ``1/2``, ``0.5``, ``\\frac{2}{4}`` and
  ``50\\%`` all vote as ``1/2``; ``72`` and ``72.0`` as ``72``; ``x+1`` and ``1+x`` as ``x + 1``.
- Nothing parses: None (the sample does not vote).

What is not covered:
- Equivalences sympy does not reach by automatic evaluation: ``(x+1)^2`` and ``x^2+2x+1`` vote
  apart (no ``simplify``: it can take seconds), as do ``0.333`` (``333/1000``) and ``1/3``.
- Timeouts: parsing uses math-verify's SIGALRM timeout in the main thread; from other threads
  there is none (SIGALRM cannot be used there), as in ``math_score``.
"""
from __future__ import annotations

import logging
import threading

import sympy

from ibpo_lit.rewards.math import parse_completion

logger = logging.getLogger(__name__)

PARSE_TIMEOUT_S = 5


def _parse_completion(completion: str) -> list:
    # SIGALRM-based: a timeout only in the main thread (where the evaluate CLI runs).
    timeout = PARSE_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    return parse_completion(completion, parsing_timeout=timeout)


def canonical_answer(parsed) -> str:
    """The canonical string of one math-verify result (a sympy object or a string)."""
    if not isinstance(parsed, sympy.Basic):
        return str(parsed).strip()
    expr = parsed
    try:
        expr = expr.doit()
        if expr.has(sympy.Float):
            expr = sympy.nsimplify(expr, rational=True)
    except Exception:  # sympy refuses some objects (sets, relations): keep them as parsed
        logger.debug("could not evaluate %r", parsed, exc_info=True)
    return sympy.sstr(expr)


def extract_answer(completion: str) -> str | None:
    """The canonical final answer of ``completion``, or None when nothing parses."""
    try:
        parsed = _parse_completion(completion)
        return canonical_answer(parsed[0]) if parsed else None
    except Exception:  # math-verify / sympy errors: no answer to vote with
        logger.debug("no answer extracted from %r", completion[-200:], exc_info=True)
        return None
