"""Rewards that fail: a verifier that raises, hangs (killed with its worker process) or returns
None makes that response unscorable (NaN), group statistics leave it out, no advantage is NaN
and nothing is silently scored 0; the counts are logged. Degenerate groups give 0.

Reward worker processes import this module by name to find ``flaky``, so its top-level imports
stay light (no torch, no Lightning); the tests import those inside.
"""
from __future__ import annotations

import functools
import math
import os
import sys
import time
import zlib

import pytest

from ibpo_lit.rewards import REWARDS

HANG_ONCE_ENV = "IBPO_TEST_HANG_ONCE"  # a path: the first item scored after it is set hangs


def flaky(completion: str, gold: str) -> float | None:
    """Hangs once per run (the first caller to create the marker file), then by a CRC of the
    response: raises (1 in 4), returns None (1 in 4), or scores 0 or 1."""
    marker = os.environ.get(HANG_ONCE_ENV)
    if marker:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            time.sleep(100)  # the pool kills this worker at reward_timeout_s
    bucket = zlib.crc32(completion.encode()) % 4
    if bucket == 0:
        raise RuntimeError("verifier crashed")
    if bucket == 1:
        return None
    return float(bucket == 2)


REWARDS.register("flaky")(flaky)


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")  # (tests/conftest.py)


# ------------------------------------------------------------------ group statistics
def test_unscorable_samples_are_left_out_of_the_group_statistics():
    import torch

    from ibpo_lit.algorithms.advantages import grouped_advantages

    nan = math.nan
    # one group [1, NaN, 0, 0]: the finite rewards' mean is 1/3, population std
    # sqrt(((2/3)^2 + 2 (1/3)^2) / 3) = sqrt(2)/3, so A = (2/3) / (sqrt(2)/3) = sqrt(2) for the
    # 1 and -(1/3) / (sqrt(2)/3) = -1/sqrt(2) for the 0s; the NaN gets 0, not NaN and not
    # "a 0 reward" (which would have moved the mean to 1/4).
    adv = grouped_advantages(torch.tensor([1.0, nan, 0.0, 0.0]), torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(adv, torch.tensor([math.sqrt(2), 0.0, -1 / math.sqrt(2), -1 / math.sqrt(2)]))


@pytest.mark.parametrize(
    "rewards",
    [[0.5, 0.5, 0.5], [1.0], [math.nan, math.nan], [math.nan, 1.0, math.nan], [0.0, math.nan, 0.0]],
    ids=["all-equal", "group-of-one", "all-unscorable", "one-scorable", "equal-scorable"],
)
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_degenerate_groups_give_zero_never_nan(rewards, scale):
    import torch

    from ibpo_lit.algorithms.advantages import grouped_advantages

    adv = grouped_advantages(torch.tensor(rewards), torch.zeros(len(rewards), dtype=torch.long), scale=scale)
    assert torch.equal(adv, torch.zeros(len(rewards)))


# ------------------------------------------------------------------ end to end
def _reference_advantages(rewards: list[float], groups: list[int]) -> list[float]:
    """GRPO's group advantage over each group's finite rewards, written out per group."""
    out = [0.0] * len(rewards)
    for g in set(groups):
        rows = [i for i, (r, gi) in enumerate(zip(rewards, groups)) if gi == g and math.isfinite(r)]
        values = [rewards[i] for i in rows]
        if len(values) < 2 or max(values) == min(values):
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        for i in rows:
            out[i] = (rewards[i] - mean) / (std + 1e-8)
    return out


@pytest.mark.slow
def test_a_tiny_fit_with_a_failing_verifier(tmp_path, monkeypatch):
    import torch

    import ibpo_lit.module
    from ibpo_lit.__main__ import main
    from ibpo_lit.module import IBPOModule
    from ibpo_lit.rewards import scoring_pool

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    monkeypatch.setenv(HANG_ONCE_ENV, str(tmp_path / "hung"))
    # the reward workers import this module to find "flaky"
    monkeypatch.setattr(ibpo_lit.module, "scoring_pool", functools.partial(scoring_pool, import_modules=[__name__]))

    steps, scored, pools = [], [], []
    original_assemble, original_score = ibpo_lit.module.assemble_update, IBPOModule.score

    def spy_assemble(step, *args):
        metrics = original_assemble(step, *args)
        steps.append((step.rewards.clone(), step.shaped_rewards.clone(), step.update.advantages.clone(),
                      step.rollouts.group_index.tolist(), dict(metrics)))
        return metrics

    def spy_score(self, texts, prompts):
        values = original_score(self, texts, prompts)
        scored.append(values)
        pools.append(dict(self._reward_pool.stats))
        return values

    monkeypatch.setattr(ibpo_lit.module, "assemble_update", spy_assemble)
    monkeypatch.setattr(IBPOModule, "score", spy_score)
    main(["fit", "--config", os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml"),
          "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar",
          "false", "--model.reward", "flaky", "--model.reward_workers", "2", "--model.reward_timeout_s", "1"])

    assert len(steps) == 2
    for rewards, shaped, advantages, groups, metrics in steps:
        n = len(rewards)
        assert rewards.isnan().any(), "no unscorable response: the test exercised nothing"
        assert set(rewards[~rewards.isnan()].tolist()) <= {0.0, 1.0}
        assert torch.isfinite(advantages).all()
        assert (advantages[:n][rewards.isnan()] == 0).all()
        torch.testing.assert_close(advantages[:n], torch.tensor(_reference_advantages(shaped.tolist(), groups)))
        assert metrics["train/unscorable"] == float(rewards.isnan().sum())
        assert math.isfinite(metrics["train/reward"])  # a mean over the scorable ones
        assert metrics["train/reward"] == pytest.approx(float(rewards[~rewards.isnan()].mean()))

    # every unscorable response has a cause in the pool's counts: exactly one hang, some raises
    # and some Nones; none of them became a 0
    final = pools[-1]
    assert final["timeout"] == 1 and final["error"] > 0 and final["none"] > 0
    assert sum(int(v.isnan().sum()) for v in scored) == final["timeout"] + final["error"] + final["none"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = next((tmp_path / "lightning_logs" / "version_0").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events))
    acc.Reload()
    logged = {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert logged["train/unscorable"] == [m["train/unscorable"] for *_, m in steps]
    assert logged["train/reward_timeouts"][-1] == 1.0
    assert logged["train/reward_errors"][-1] == float(final["error"])
