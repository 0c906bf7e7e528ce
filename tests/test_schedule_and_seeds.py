import math

from ibpo_lit.algorithms.schedule import warmup_cosine
from ibpo_lit.training.seeding import CORRECTIONS, MAIN_ROLLOUTS, rollout_seeds


def test_warmup_is_linear_then_cosine_to_the_floor():
    # total 100, warm-up 3: steps 0,1,2 -> 1/3, 2/3, 3/3
    assert [warmup_cosine(s, 100, 3, 0.1) for s in range(3)] == [1 / 3, 2 / 3, 1.0]
    # step 3 starts the decay at progress 0 -> 1.0
    assert warmup_cosine(3, 100, 3, 0.1) == 1.0
    # halfway through the decay (3 + 97/2 = 51.5): 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55
    assert math.isclose(warmup_cosine(51.5, 100, 3, 0.1), 0.55)
    # end and beyond: the floor
    assert math.isclose(warmup_cosine(100, 100, 3, 0.1), 0.1)
    assert math.isclose(warmup_cosine(500, 100, 3, 0.1), 0.1)


def test_no_warmup_starts_at_peak():
    assert warmup_cosine(0, 10, 0, 0.0) == 1.0
    # cosine to 0 at step 10: step 5 -> 0.5
    assert math.isclose(warmup_cosine(5, 10, 0, 0.0), 0.5)


def test_seeds_are_distinct_across_rows_steps_and_streams_and_reproducible():
    a = rollout_seeds(0, 0, MAIN_ROLLOUTS, 16)
    assert a == rollout_seeds(0, 0, MAIN_ROLLOUTS, 16)
    assert len(set(a)) == 16
    everything = set(a) | set(rollout_seeds(0, 1, MAIN_ROLLOUTS, 16)) | set(rollout_seeds(0, 0, CORRECTIONS, 16))
    everything |= set(rollout_seeds(1, 0, MAIN_ROLLOUTS, 16))
    assert len(everything) == 64
