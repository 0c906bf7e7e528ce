"""Rewards that fail: a verifier that raises, hangs (killed with its worker process) or returns
None makes that response unscorable (NaN), group statistics leave it out, no advantage is NaN
and nothing is silently scored 0; the counts are logged. Degenerate groups give 0.

A reward that fails on every call (raises, hangs, returns the wrong length or not a list; or a
code sandbox that cannot run) stops the run after ``model.max_unscorable_steps`` steps in a row
with one ``ibpo-lit: error:`` line naming the reward and its last error (issue 30, item 6); one
that fails only sometimes does not, a step with a scorable response resets the count, and the
count survives a resume. The two-process case is tests/scale/test_unscorable_ranks.py.

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
    from ibpo_lit.tasks import scoring_pool

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


# ------------------------------------------------------------------ a reward that never scores: the run stops
TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")


def _fit_args(root, reward: str, *extra: str) -> list[str]:
    """A tiny fit scored by ``misbehaving_rewards:<reward>`` (its folder is on sys.path: the
    reward workers get the parent's)."""
    return ["fit", "--config", TINY, "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar",
            "false", "--trainer.logger", "false", "--trainer.limit_val_batches", "0",
            "--model.reward", f"misbehaving_rewards:{reward}", *extra]


def _saved(root) -> dict:
    """ibpo-lit's state in the run's last checkpoint (written after every step)."""
    import torch

    return torch.load(os.path.join(str(root), "checkpoints", "last.ckpt"), weights_only=False)["ibpo_lit"]


@pytest.fixture
def plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # LightningCLI warns about pytest's own arguments


@pytest.fixture(scope="module")
def command_line():
    """``python -m ibpo_lit``, imported before any test's ``capsys``: Lightning's log handler keeps
    the stderr it was made with, and a test's is closed after it. (Not a top-level import:
    reward workers import this module.)"""
    from ibpo_lit.__main__ import entry_point

    return entry_point


@pytest.mark.slow
@pytest.mark.parametrize(
    "reward, extra, last_error",
    [
        ("divides_by_zero", [],
         "ZeroDivisionError: division by zero in divides_by_zero at misbehaving_rewards.py:"),
        ("hangs", ["--model.reward_timeout_s", "0.1", "--model.reward_workers", "2"],
         "timed out after 0.8 s on a batch of 8 response(s) (model.reward_timeout_s: 0.1 s each)"),
        ("one_short", [], "returned 15 values for 16 completions"),
        ("not_a_list", [], "returned a str, not a list of 16 numbers"),
    ],
    ids=["raises", "hangs", "wrong-length", "wrong-type"],
)
def test_a_reward_that_always_fails_stops_the_run_with_one_line(tmp_path, capsys, plain_argv, command_line, reward,
                                                                  extra, last_error):
    assert command_line(_fit_args(tmp_path, reward, "--trainer.max_steps", "6", "--model.max_unscorable_steps", "2",
                                 *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err), "\n".join(err)
    assert err[-1].startswith(f"ibpo-lit: error: reward 'misbehaving_rewards:{reward}' could not score any response "
                              f"for 2 steps in a row (last error: {last_error}"), err[-1]
    assert err[-1].endswith("); fix the reward or raise model.max_unscorable_steps"), err[-1]
    # exactly 2 steps: the first finished (its checkpoint counts 1 such step), the second stopped
    saved = _saved(tmp_path)
    assert saved["rollout_step"] == 1 and saved["unscorable_streak"] == {"run": 1}


@pytest.mark.slow
def test_the_count_survives_a_resume(tmp_path, capsys, plain_argv, command_line):
    args = _fit_args(tmp_path, "divides_by_zero", "--model.max_unscorable_steps", "3")
    assert command_line([*args, "--trainer.max_steps", "2"]) == 0  # 2 failed steps: not yet 3
    assert _saved(tmp_path)["unscorable_streak"] == {"run": 2}
    ckpt = os.path.join(str(tmp_path), "checkpoints", "last.ckpt")
    assert command_line([*args, "--trainer.max_steps", "6", "--ckpt_path", ckpt]) == 2
    assert "for 3 steps in a row" in capsys.readouterr().err
    assert _saved(tmp_path)["rollout_step"] == 2  # the first step after the resume stopped it


@pytest.mark.slow
@pytest.mark.parametrize(
    "reward, extra",
    [("half_not_numbers", []), ("raises_on_odd", ["--model.reward_batch_size", "1", "--model.reward_workers", "2"])],
    ids=["some-values-bad", "some-calls-raise"],
)
def test_a_reward_that_fails_only_sometimes_does_not_stop_the_run(tmp_path, plain_argv, command_line, reward, extra):
    assert command_line(_fit_args(tmp_path, reward, "--trainer.max_steps", "2", "--model.max_unscorable_steps", "1",
                                 *extra)) == 0
    saved = _saved(tmp_path)
    assert saved["rollout_step"] == 2 and saved["unscorable_streak"] == {"run": 0}
    assert saved["reward_counts"]["error"] > 0  # it did fail: the test exercised something


@pytest.mark.slow
def test_a_step_with_a_scorable_response_resets_the_count(tmp_path, plain_argv, command_line):
    # One reward worker, one call per step (no corrections, no validation): steps 1-2 and 4-5
    # fail as a whole, 3 and 6 score. Without the reset, step 4 would be the third failed one.
    assert command_line(_fit_args(tmp_path, "fails_two_calls_in_three", "--trainer.max_steps", "6",
                                 "--model.max_unscorable_steps", "3", "--model.algorithm.ibpo.variant", "none",
                                 "--trainer.callbacks", "[]")) == 0
    saved = _saved(tmp_path)
    assert saved["rollout_step"] == 6 and saved["unscorable_streak"] == {"run": 0}
    assert saved["reward_counts"]["error"] == 4 * 16  # 4 failed steps of 2 prompts x 8 rollouts


# ------------------------------------------------------------------ the pieces
class _TwoRanks:
    """A `RankSync` stand-in for rank 0 of two: the other rank's unscorable and total rows, and
    its ``(reward, last error)``, are given."""

    world_size = 2
    active = True

    def __init__(self, other_unscorable: int, other_total: int, other_failure=None):
        self.other = [float(other_unscorable), float(other_total)]
        self.other_failure = other_failure

    def sum(self, values):
        return [v + o for v, o in zip(values, self.other)]

    def gather(self, obj):
        return [obj, self.other_failure]


def test_the_count_is_over_every_process():
    import torch

    from ibpo_lit.errors import UnscorableRewardsError, is_user_error
    from ibpo_lit.training.unscorable import UnscorableStreak

    nan = math.nan
    streak = UnscorableStreak(2, ["my_pkg.rewards:fn"])
    mine = torch.tensor([nan, nan, nan])
    for _ in range(4):  # this rank scores nothing, the other rank scores 1 of its 3: no stop
        streak.check(mine, _TwoRanks(2, 3), ("my_pkg.rewards:fn", "ValueError: x in fn at r.py:1"))
    assert streak.run == 0
    streak.check(mine, _TwoRanks(3, 3), None)  # both score nothing: 1
    streak.check(torch.tensor([nan, 1.0, nan]), _TwoRanks(3, 3), None)  # one scorable row: reset
    assert streak.run == 0
    streak.check(mine, _TwoRanks(3, 3), None)
    # the second in a row: this rank has no error to name, the other rank's is named
    with pytest.raises(UnscorableRewardsError) as stop:
        streak.check(mine, _TwoRanks(3, 3, ("my_pkg.rewards:fn", "ZeroDivisionError: division by zero in fn")), None)
    assert is_user_error(stop.value)
    assert str(stop.value) == ("reward 'my_pkg.rewards:fn' could not score any response for 2 steps in a row (last "
                               "error: ZeroDivisionError: division by zero in fn); fix the reward or raise "
                               "model.max_unscorable_steps")
    with pytest.raises(ValueError, match="max_unscorable_steps must be >= 1"):
        UnscorableStreak(0, ["math"])


def test_weighted_rewards_name_the_reward_that_failed():
    from ibpo_lit.rewards import RewardSpec, WeightedRewards

    class Fixed:
        def __init__(self, values, last_error):
            self.values, self.last_error, self.stats = values, last_error, {}

        def score(self, pairs, prompts=None, columns=None):
            return self.values

        def close(self):
            pass

    pools = {"ok": Fixed([1.0, 1.0], None), "pkg:judge": Fixed([None, None], "RuntimeError: offline"),
             "pkg:logged": Fixed([None, None], "ValueError: not this one")}
    specs = [RewardSpec("ok"), RewardSpec("pkg:judge", 0.5), RewardSpec("pkg:logged", 0.0)]
    with WeightedRewards(specs, pools.__getitem__) as rewards:
        assert rewards.last_failure is None  # nothing scored yet
        assert rewards.score([("a", "1"), ("b", "1")]) == [None, None]
        # the weight-0 reward is only logged: it never makes a response unscorable, so it is not named
        assert rewards.last_failure == ("pkg:judge", "RuntimeError: offline")
        pools["pkg:judge"].values = [None, 2.0]
        rewards.score([("a", "1"), ("b", "1")])
        assert rewards.last_failure == ("pkg:judge", "RuntimeError: offline")
        pools["pkg:judge"].values = [1.0, 2.0]
        rewards.score([("a", "1"), ("b", "1")])
        assert rewards.last_failure is None


def test_a_sandbox_that_cannot_run_is_unscorable_with_its_cause(monkeypatch, caplog):
    import logging

    import ibpo_lit.rewards.sandbox.pool as sandbox_pool
    from ibpo_lit.rewards import CodeTests, SandboxUnavailable
    from ibpo_lit.tasks import scoring_pool

    def unavailable(completion, spec):
        raise SandboxUnavailable("the code sandbox cannot run on this host (no user namespaces). See docs/sandbox.md.")

    monkeypatch.setattr(sandbox_pool, "run_code_tests", unavailable)
    gold = CodeTests(tests=("assert f() == 1",), remote=("f",)).to_gold()
    with scoring_pool("code", num_workers=2) as pool, caplog.at_level(logging.DEBUG, logger=sandbox_pool.__name__):
        assert pool.score([("def f(): return 1", gold)] * 3) == [None, None, None]
        assert pool.unscorable == {"timeout": 0, "error": 0, "none": 3}
        assert pool.last_error == ("SandboxUnavailable: the code sandbox cannot run on this host (no user "
                                   "namespaces). See docs/sandbox.md.")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # the same cause for every program: logged once
