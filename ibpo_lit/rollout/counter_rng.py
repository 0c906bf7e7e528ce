"""Per-row sampling uniforms from a counter-based generator: ``u[b] = f(seed[b], step)``.

Why not a ``torch.Generator`` per row (what the HF engine's dynamic decode uses): a Python loop
over generators cannot be captured in a CUDA graph, nor traced by ``torch.compile``, and one
generator per row is one kernel launch per row and step. A counter-based generator is a pure
function of (key, counter): the whole batch's uniforms are a few elementwise integer ops on
tensors, with fixed shapes, that a graph captures and inductor fuses into one kernel; and the
draw for step ``t`` needs no state carried from step ``t - 1``, so nothing has to be advanced,
saved or restored (a resumed call draws the same numbers by construction).

The function is Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as
1, 2, 3", SC 2011; the generator behind cuRAND's and torch's CUDA RNG): 10 rounds of two 32x32->64
bit multiplications and xors with a bumped key. It passes TestU01's BigCrush, and every distinct
(key, counter) pair gives an independent-looking output (a bijection of the counter for each key).
No library we have computes it on tensors with a per-row key (numpy's ``Philox`` is a stateful
4x64 generator; torch's is internal to its CUDA kernels, one seed per launch), so it is written
out here and checked against Random123's published known-answer vectors (tests/rollout/
test_counter_rng.py).

Written so that every backend computes exactly the same integers: values are uint32 held in
int64 tensors, and each 32x32-bit product is split into 16-bit halves so no intermediate exceeds
2^49 (a full 32x32 product overflows int64, and signed overflow is undefined in the C++ that
inductor emits). Shifts then act on non-negative values only, where arithmetic and logical shifts
agree. So CPU and CUDA, eager and compiled, give bit-identical uniforms (the CPU cases are tested;
the CUDA one is by construction and is for the GPU session to confirm).

What is covered:
    * ``philox4x32_10(counter, key)``: the generator itself, on broadcastable uint32 tensors.
    * ``seed_keys(seeds)``: a row's 64-bit seed as its Philox key (two 32-bit words; negative
      seeds taken modulo 2^64, as ``torch.Generator.manual_seed`` takes them).
    * ``counter_uniforms(keys, step)``: one float32 in [0, 1) per row for decoding step ``step``:
      the first output word's top 24 bits over 2^24. 24 bits because that is float32's
      precision: each value is exact, the largest is 1 - 2^-24, so ``u < 1`` always (a 53-bit
      value rounded to float32 can round up to 1.0, which inverse-CDF sampling must never see).
      The same resolution as ``torch.rand``'s float32.

What is not covered: more than 2^64 steps per seed; streams other than the decode's (the counter's
upper two words are 0, free for another use to separate its stream).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers (Random123's PHILOX_M4x32_0/1)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # the key's Weyl increments (golden ratio, sqrt(3) - 1)
ROUNDS = 10


def _mulhilo32(multiplier: int, x: Tensor) -> tuple[Tensor, Tensor]:
    """(high, low) 32-bit words of ``multiplier * x`` for uint32 ``x`` in int64, exactly: the
    multiplier split in 16-bit halves keeps every intermediate below 2^49."""
    low_half = x * (multiplier & 0xFFFF)  # < 2^48
    high_half = x * (multiplier >> 16)  # < 2^48: the product is low_half + high_half * 2^16
    low = low_half + ((high_half & 0xFFFF) << 16)  # < 2^49
    return (high_half >> 16) + (low >> 32), low & _MASK32


def philox4x32_10(counter: Sequence[Tensor], key: Sequence[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Philox4x32-10 of a 4-word ``counter`` under a 2-word ``key``: four uint32 words out.
    Every word is an int64 tensor (or broadcastable to the others) holding a value in [0, 2^32)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_ in range(ROUNDS):
        if round_:  # the key is bumped between rounds, not before the first
            k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
        hi0, lo0 = _mulhilo32(_M0, c0)
        hi1, lo1 = _mulhilo32(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def seed_keys(seeds: Sequence[int], device: torch.device | str | None = None) -> Tensor:
    """[B, 2] int64: each seed (an int, taken modulo 2^64) as its low and high 32-bit words."""
    words = [[(int(s) & 0xFFFFFFFFFFFFFFFF) & _MASK32, (int(s) & 0xFFFFFFFFFFFFFFFF) >> 32] for s in seeds]
    return torch.tensor(words, dtype=torch.long, device=device).reshape(len(words), 2)


def counter_uniforms(keys: Tensor, step: Tensor | int) -> Tensor:
    """[B] float32 in [0, 1): row ``b``'s uniform for decoding step ``step`` (an int or a 0-dim
    int64 tensor, so a compiled caller does not specialise on it), a function of
    (``keys[b]``, ``step``) alone. ``keys``: [B, 2] from ``seed_keys``."""
    step = torch.as_tensor(step, dtype=torch.long, device=keys.device)
    zero = torch.zeros_like(keys[:, 0])
    counter = (zero + (step & _MASK32), zero + (step >> 32), zero, zero)
    word = philox4x32_10(counter, (keys[:, 0], keys[:, 1]))[0]
    return (word >> 8).to(torch.float32) * (1.0 / (1 << 24))
