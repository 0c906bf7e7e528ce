"""Synthetic arithmetic problems made in code: "What is 47 + 8?" -> "55".

What is covered:
- Problems of ``operands`` numbers (two by default; more make multi-step problems such as
  "What is 12 + 7 * 3 - 5?", evaluated with the usual precedence) with ``+``, ``-`` and ``*``. Each operand first draws its digit count
  uniformly from ``[min_digits, max_digits]``, then a value uniformly among the numbers with that
  many digits (one digit: 0-9), capped at ``max_operand`` when set.
- Determinism: problem ``index`` is drawn from its own RNG seeded by ``(seed, index)``, so a
  stream position alone fixes the problem (exact resume, any number of workers) and it does not
  depend on Python's hash seed. An unset ``seed`` is the stream of seed 0 here: the data module
  resolves it first (unset: ``seed_everything``'s, `ibpo_lit.seeds`).
- The held-out stream (`held_out`) is an evaluation set: it follows an explicit ``seed`` only, so
  runs that differ in ``seed_everything`` validate on the same problems.
- With ``allow_negative=False`` (the default) subtraction puts the larger operand first (two
  operands), or a problem whose answer would be negative is drawn again from the same generator
  (more operands).

What is not covered:
- Division, parentheses, word problems.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Literal, Optional

from ibpo_lit.seeds import DEFAULT_SEED

Op = Literal["+", "-", "*"]
OPS = ("+", "-", "*")


@dataclass(frozen=True)
class ArithmeticConfig:
    """Synthetic arithmetic problems.

    Args:
        min_digits: Fewest digits per operand (1 allows 0-9).
        max_digits: Most digits per operand.
        ops: Operators to draw from, any of "+", "-", "*".
        max_operand: If set, cap every operand at this value (keeps answers small, e.g. for a
            tiny random model that earns reward only by luck).
        allow_negative: Allow negative answers from "-"; if false the larger operand comes first.
        seed: Seed of the training problem stream; problem i is the same for the same seed.
            Unset: ``seed_everything``'s (0 without it). The held-out problems (``data.val_size``)
            follow only a seed set here, so runs over several ``seed_everything`` values
            validate on the same problems.
        operands: Numbers per problem (>= 2); more than two make multi-step problems, evaluated
            with the usual precedence (``*`` before ``+`` and ``-``).
    """

    min_digits: int = 1
    max_digits: int = 2
    ops: tuple[Op, ...] = ("+",)
    max_operand: int | None = None
    allow_negative: bool = False
    seed: Optional[int] = None
    operands: int = 2

    def __post_init__(self) -> None:
        if self.min_digits < 1:
            raise ValueError(f"arithmetic.min_digits must be >= 1, got {self.min_digits}")
        if self.max_digits < self.min_digits:
            raise ValueError(
                f"arithmetic.max_digits ({self.max_digits}) must be >= min_digits ({self.min_digits})"
            )
        ops = tuple(self.ops)
        object.__setattr__(self, "ops", ops)  # lists from YAML become tuples
        if not ops or any(op not in OPS for op in ops):
            raise ValueError(f"arithmetic.ops must be a non-empty subset of {OPS}, got {ops}")
        if self.operands < 2:
            raise ValueError(f"arithmetic.operands must be >= 2, got {self.operands}")
        if self.max_operand is not None and self.max_operand < _smallest(self.min_digits):
            raise ValueError(
                f"arithmetic.max_operand ({self.max_operand}) is below the smallest "
                f"{self.min_digits}-digit number ({_smallest(self.min_digits)})"
            )


def _smallest(digits: int) -> int:
    return 0 if digits == 1 else 10 ** (digits - 1)


def _operand(rng: random.Random, cfg: ArithmeticConfig) -> int:
    digits = rng.randint(cfg.min_digits, cfg.max_digits)
    lo, hi = _smallest(digits), 10**digits - 1
    if cfg.max_operand is not None:
        hi = min(hi, cfg.max_operand)
        if hi < lo:  # this digit count is entirely above the cap: use the smallest allowed count
            lo, hi = _smallest(cfg.min_digits), min(10**cfg.min_digits - 1, cfg.max_operand)
    return rng.randint(lo, hi)


HELD_OUT_SEED_OFFSET = 1_000_003  # validation's stream: a seed no training stream is likely to use


def held_out(cfg: ArithmeticConfig) -> ArithmeticConfig:
    """The held-out stream of ``cfg``: the same kind of problems, drawn from another seed.
    Validation (``data.val_size``) scores its first problems; `scripts/compare.py --final-eval`
    evaluates more of them. An evaluation set, fixed across runs: it follows ``cfg.seed`` when
    set, never ``seed_everything`` (unset: `DEFAULT_SEED`'s)."""
    return replace(cfg, seed=_seed(cfg) + HELD_OUT_SEED_OFFSET)


def _seed(cfg: ArithmeticConfig) -> int:
    return DEFAULT_SEED if cfg.seed is None else cfg.seed


def arithmetic_problem(index: int, cfg: ArithmeticConfig) -> tuple[str, str]:
    """Problem number ``index`` of the stream: ``(problem_text, gold)``.

    Example: ``("What is 47 + 8?", "55")``.
    """
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    rng = random.Random(f"ibpo-arithmetic:{_seed(cfg)}:{index}")  # str seeds hash with sha512
    if cfg.operands > 2:
        return _multi_step(rng, cfg)
    a, b = _operand(rng, cfg), _operand(rng, cfg)
    op = rng.choice(cfg.ops)
    if op == "+":
        result = a + b
    elif op == "-":
        if not cfg.allow_negative and b > a:
            a, b = b, a
        result = a - b
    else:
        result = a * b
    return f"What is {a} {op} {b}?", str(result)


MAX_DRAWS = 1000  # a negative answer is drawn again; with "+" among the ops one soon is not


def _multi_step(rng: random.Random, cfg: ArithmeticConfig) -> tuple[str, str]:
    """``cfg.operands`` numbers joined by drawn operators, valued with the usual precedence
    (products first, then sums and differences left to right)."""
    for _ in range(MAX_DRAWS):
        numbers = [_operand(rng, cfg) for _ in range(cfg.operands)]
        ops = [rng.choice(cfg.ops) for _ in range(cfg.operands - 1)]
        value = _value(numbers, ops)
        if value >= 0 or cfg.allow_negative:
            text = " ".join(f"{n} {op}" for n, op in zip(numbers, ops)) + f" {numbers[-1]}"
            return f"What is {text}?", str(value)
    raise ValueError(f"arithmetic: no problem with a non-negative answer in {MAX_DRAWS} draws "
                     f"(ops {cfg.ops}); set allow_negative: true")


def _value(numbers: list[int], ops: list[str]) -> int:
    """The value of ``n0 op0 n1 op1 ...`` with ``*`` binding tighter than ``+`` and ``-``."""
    terms, signs = [numbers[0]], [1]
    for op, n in zip(ops, numbers[1:]):
        if op == "*":
            terms[-1] *= n
        else:
            terms.append(n)
            signs.append(1 if op == "+" else -1)
    return sum(sign * term for sign, term in zip(signs, terms))

