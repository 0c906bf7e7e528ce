"""The static decode's counter-based uniforms: Philox4x32-10 against Random123's published
known answers, exact integer arithmetic, a function of (seed, step) alone, uniform on [0, 1)
(KS and chi-square on 1e5 draws at fixed thresholds, which a slightly biased source fails),
independent-looking across seeds and steps."""
import math

import pytest
import torch

from ibpo_lit.rollout.counter_rng import counter_uniforms, philox4x32_10, seed_keys

# Random123's kat_vectors for philox4x32 with 10 rounds (Salmon et al. 2011): counter, key, output.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]
N_SEEDS, N_STEPS = 1000, 100  # 1e5 draws
# Fixed thresholds at a 0.1% false-alarm rate: KS 1.95 / sqrt(n); chi-square, 99 degrees of freedom.
KS_LIMIT = 1.95 / math.sqrt(N_SEEDS * N_STEPS)
CHI2_LIMIT_99 = 148.23


def words(values):
    return [torch.tensor(v, dtype=torch.long) for v in values]


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_philox_matches_the_published_known_answers(counter, key, expected):
    assert tuple(int(w) for w in philox4x32_10(words(counter), words(key))) == expected


def test_philox_batches_the_known_answers_in_one_call():
    """Row b of a batched call is the scalar call on row b: tensors hold many (counter, key)."""
    counters = torch.tensor([c for c, _, _ in KNOWN_ANSWERS]).T
    keys = torch.tensor([k for _, k, _ in KNOWN_ANSWERS]).T
    out = torch.stack(philox4x32_10(tuple(counters), tuple(keys)), dim=1)
    assert out.tolist() == [list(e) for _, _, e in KNOWN_ANSWERS]


def draws() -> torch.Tensor:
    """[N_SEEDS, N_STEPS]: seeds 0..999, steps 0..99."""
    keys = seed_keys(range(N_SEEDS))
    return torch.stack([counter_uniforms(keys, step) for step in range(N_STEPS)], dim=1)


@pytest.fixture(scope="module")
def uniforms():
    return draws()


def ks_statistic(u: torch.Tensor) -> float:
    """Kolmogorov-Smirnov distance of the sample from Uniform(0, 1)."""
    x = u.flatten().double().sort().values
    n = x.numel()
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return float(torch.maximum(i / n - x, x - (i - 1) / n).max())


def chi_square(u: torch.Tensor, bins: int = 100) -> float:
    counts = torch.bincount((u.flatten() * bins).long(), minlength=bins).double()
    expected = u.numel() / bins
    return float(((counts - expected) ** 2 / expected).sum())


def test_uniforms_are_float32_in_the_half_open_unit_interval_on_a_24_bit_grid(uniforms):
    assert uniforms.dtype == torch.float32
    assert float(uniforms.min()) >= 0.0 and float(uniforms.max()) < 1.0
    assert torch.equal(uniforms * 2**24, (uniforms * 2**24).floor())  # exact multiples of 2^-24


def test_uniforms_pass_ks_and_chi_square_and_a_biased_source_does_not(uniforms):
    assert ks_statistic(uniforms) < KS_LIMIT
    assert chi_square(uniforms) < CHI2_LIMIT_99
    # The thresholds catch a small bias: u ** 1.05 moves the median by 0.017.
    biased = uniforms.double() ** 1.05
    assert ks_statistic(biased) > KS_LIMIT and chi_square(biased) > CHI2_LIMIT_99


def test_draws_are_uncorrelated_across_steps_and_across_seeds(uniforms):
    limit = 4 / math.sqrt(uniforms.numel())  # 4 standard errors of a correlation
    centred = uniforms.double() - 0.5
    along_steps = (centred[:, 1:] * centred[:, :-1]).mean() / centred.var()
    along_seeds = (centred[1:] * centred[:-1]).mean() / centred.var()
    assert abs(float(along_steps)) < limit and abs(float(along_seeds)) < limit
    assert len({tuple(row) for row in uniforms.tolist()}) == N_SEEDS  # every seed its own stream


def test_a_draw_depends_only_on_its_seed_and_step():
    alone = counter_uniforms(seed_keys([1234]), 7)
    batch = counter_uniforms(seed_keys([5, 1234, 9, 1234]), torch.tensor(7))
    assert batch[1] == alone[0] and batch[3] == alone[0]  # bit for bit, whatever the batch
    assert torch.equal(counter_uniforms(seed_keys([5, 1234]), 7), batch[:2])  # again: no state
    assert counter_uniforms(seed_keys([1234]), 8)[0] != alone[0]


def test_seeds_are_taken_modulo_2_to_the_64_in_two_words():
    assert seed_keys([0, 1, 2**32, 2**64 - 1, -1]).tolist() == [
        [0, 0], [1, 0], [0, 1], [0xFFFFFFFF, 0xFFFFFFFF], [0xFFFFFFFF, 0xFFFFFFFF]]
    high = counter_uniforms(seed_keys([0, 2**32, 2**63]), 0)
    assert len(set(high.tolist())) == 3  # the high word counts
    assert seed_keys([]).shape == (0, 2)


def test_large_steps_use_the_counters_high_word():
    keys = seed_keys([3])
    assert counter_uniforms(keys, 2**32 + 5)[0] != counter_uniforms(keys, 5)[0]
