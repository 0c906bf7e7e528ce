"""Token-level edit alignment for IBPO (METHOD section 5, "Full-rewrite filter", IBPO-ratio).

Covered:
- ``normalized_edit_distance``: Levenshtein distance over token ids / the longer length;
- ``kept_positions``: which tokens of the wrong rollout the correction kept (the set U);
- ``is_full_rewrite``: the paper's two-sided filter;
- ``adaptive_alpha``: ``mean(d) + 2*std(d)`` over the batch's successful corrections.

Choices the paper leaves open:
- Distance of two empty sequences is 0.0 (identical).
- U comes from ``Levenshtein.opcodes`` (one minimal alignment): a token is kept when it lies in
  an "equal" block. Among several minimal alignments the library's choice is taken as is.
- ``adaptive_alpha`` uses the population std; with no successful correction it returns 1.0,
  so that nothing counts as a rewrite (d <= 1, and the test is strict ``d > alpha``).

Sequences are lists of token ids (any ``Sequence[int]``, tensors included); they are turned
into plain Python ints first because ``Levenshtein`` compares elements by hash, and a
0-d tensor hashes by identity.
"""
from __future__ import annotations

import math
from typing import Sequence

import Levenshtein


def _ids(seq: Sequence[int]) -> list[int]:
    return [int(t) for t in seq]


def normalized_edit_distance(a: Sequence[int], b: Sequence[int]) -> float:
    """Levenshtein distance of two token-id sequences [La], [Lb] / max(La, Lb), in [0, 1]."""
    a, b = _ids(a), _ids(b)
    longest = max(len(a), len(b))
    if longest == 0:
        return 0.0
    return Levenshtein.distance(a, b) / longest


def kept_positions(original: Sequence[int], corrected: Sequence[int]) -> list[bool]:
    """[L_original] bools: True where the alignment of ``original`` to ``corrected`` keeps the
    token unchanged (an "equal" opcode)."""
    original, corrected = _ids(original), _ids(corrected)
    kept = [False] * len(original)
    for tag, i1, i2, _, _ in Levenshtein.opcodes(original, corrected):
        if tag == "equal":
            kept[i1:i2] = [True] * (i2 - i1)
    return kept


def is_full_rewrite(
    original: Sequence[int], corrected: Sequence[int], reference: Sequence[int], alpha: float
) -> bool:
    """True when the correction rewrote the wrong rollout rather than repairing it:
    ``d(original, corrected) > alpha and d(original, corrected) > d(corrected, reference)``
    (it moved far from the original, and closer to the reference than to the original)."""
    d_orig = normalized_edit_distance(original, corrected)
    return d_orig > alpha and d_orig > normalized_edit_distance(corrected, reference)


def adaptive_alpha(distances: Sequence[float]) -> float:
    """``mean + 2 * population std`` of the distances [N]; 1.0 when N = 0."""
    values = [float(d) for d in distances]
    if not values:
        return 1.0
    mean = sum(values) / len(values)
    var = sum((d - mean) ** 2 for d in values) / len(values)
    return mean + 2.0 * math.sqrt(var)
