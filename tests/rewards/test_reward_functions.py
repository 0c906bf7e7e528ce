"""Rewards by import path (TRL's batch convention) and several weighted rewards.

A user's module is written to a temporary folder and imported by path (``sys.path``; the reward
workers inherit the parent's), as a user would put theirs on PYTHONPATH. Each misbehaviour (raise,
hang, wrong length, not numbers, bad import path) has a defined outcome: unscorable (None in the
pool, NaN in training), counted, and one clear warning naming the function and the cause.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time

import pytest

from ibpo_lit.rewards import (
    RewardImportError,
    RewardPool,
    RewardSpec,
    WeightedRewards,
    load_reward,
    resolve_specs,
)
from ibpo_lit.rewards.functions import (
    check_values,
    combine,
    reward_label,
    stack_columns,
)
from ibpo_lit.tasks import task_for_rewards as data_task

MODULE = "ibpo_test_user_rewards"
USER_REWARDS = '''
"""A user's rewards, TRL's convention: fn(prompts, completions, **columns) -> list[float | None]."""
import time


def length_penalty(prompts, completions, **kwargs):
    """The runnable example of docs/rewards.md: -0.01 per character."""
    return [-0.01 * len(c) for c in completions]


def mentions_answer(prompts, completions, answer, **kwargs):
    return [1.0 if a is not None and str(a) in c else 0.0 for c, a in zip(completions, answer)]


def echo_columns(prompts, completions, gold, answer, level, **kwargs):
    """1 when the call saw what it should: the problem text, gold, the answer column, level."""
    return [float(p == "Q:" + g and a == "ans-" + g and lv == 3) for p, g, a, lv in zip(prompts, gold, answer, level)]


def batch_size(prompts, completions, **kwargs):
    return [float(len(completions))] * len(completions)


def raises(prompts, completions, **kwargs):
    raise ValueError("judge offline")


def hangs(prompts, completions, **kwargs):
    time.sleep(100)
    return [1.0] * len(completions)


def wrong_length(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def not_a_list(prompts, completions, **kwargs):
    return 1.0


def odd_values(prompts, completions, **kwargs):
    return ["high", 1, None, float("nan"), float("inf"), True][: len(completions)]


not_callable = 42
'''


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user_rewards")
    (folder / f"{MODULE}.py").write_text(USER_REWARDS)
    sys.path.insert(0, str(folder))  # the workers get the parent's sys.path
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)


def path(fn: str) -> str:
    return f"{MODULE}:{fn}"


# ------------------------------------------------------------------ pure helpers, hand-derived
def test_check_values():
    assert check_values([1, 0.5, None, float("nan"), True], 5) == ([1.0, 0.5, None, None, 1.0], {})
    values, errors = check_values(["high", float("inf"), 2], 3)
    assert values == [None, None, 2.0] and set(errors) == {0, 1}
    assert "'high' (str), not a number" in errors[0] and "inf" in errors[1]
    with pytest.raises(ValueError, match="returned 2 values for 3 completions"):
        check_values([1, 2], 3)
    with pytest.raises(ValueError, match="returned a float, not a list of 3 numbers"):
        check_values(1.0, 3)
    with pytest.raises(ValueError, match="returned a str"):
        check_values("abc", 3)


def test_combine_is_the_weighted_sum_and_any_unscorable_term_is_unscorable():
    # 1.0 * 1 + 0.5 * (-0.2) = 0.9; 1.0 * 0 + 0.5 * 0.4 = 0.2; a None of weight 1.0 or 0.5 -> None
    assert combine([[1.0, 0.0, None, 1.0], [-0.2, 0.4, 0.3, None]], [1.0, 0.5]) == [
        pytest.approx(0.9), pytest.approx(0.2), None, None]
    # weight 0: logged only, its None does not matter, nor its value
    assert combine([[1.0, 0.0], [None, 5.0]], [1.0, 0.0]) == [1.0, 0.0]
    assert combine([[0.3, None]], [1.0]) == [0.3, None]  # one reward of weight 1: unchanged


def test_labels_columns_and_data_task():
    # a built-in reward no task owns ("flaky") scores answer-style prompts: the math task's
    assert reward_label("math") == "math" and reward_label("pkg.mod:length_penalty") == "length_penalty"
    assert reward_label("pkg.mod:judge.score") == "score"
    assert stack_columns([{"a": 1, "b": 2}, {"a": 3}]) == {"a": [1, 3], "b": [2, None]}
    assert data_task(None) == "math" and data_task("code") == "code" and data_task("flaky") == "math"
    assert data_task("pkg.mod:fn") == "custom"  # rewards of the user's own only: records need no answer
    assert data_task(None, [{"name": "math"}, {"name": "code", "weight": 0.5}]) == "code"
    assert data_task(None, [RewardSpec("math"), RewardSpec("pkg.mod:fn")]) == "math"


# ------------------------------------------------------------------ loading: clear errors, early
def test_bad_import_paths_fail_early_with_the_cause(user_module):
    with pytest.raises(RewardImportError, match=r"cannot import module 'no_such_pkg\.rewards' \(ModuleNotFoundError"):
        load_reward("no_such_pkg.rewards:fn")
    with pytest.raises(RewardImportError, match=f"module '{MODULE}' has no attribute 'nope'"):
        load_reward(path("nope"))
    with pytest.raises(RewardImportError, match="'not_callable' is a int, not a function"):
        load_reward(path("not_callable"))
    with pytest.raises(RewardImportError, match="'package.module:function'"):
        load_reward("pkg.mod:")
    with pytest.raises(RewardImportError, match="no attribute"):  # in the pool: before any worker starts
        RewardPool(path("nope"))
    with pytest.raises(ValueError, match="unknown reward 'poetry'"):
        load_reward("poetry")


def test_reward_and_rewards_settings(user_module):
    assert resolve_specs(None, None) == [RewardSpec("math")]
    assert resolve_specs(path("length_penalty"), None) == [RewardSpec(path("length_penalty"))]
    specs = resolve_specs(None, [{"name": "math", "weight": 1.0}, RewardSpec(path("length_penalty"), 0.1)])
    assert specs == [RewardSpec("math"), RewardSpec(path("length_penalty"), 0.1)]
    with pytest.raises(ValueError, match="set model.reward .* or model.rewards .*, not both"):
        resolve_specs("math", [RewardSpec("math")])
    with pytest.raises(ValueError, match="model.rewards is empty"):
        resolve_specs(None, [])
    with pytest.raises(ValueError, match="logged as reward/length_penalty"):
        resolve_specs(None, [RewardSpec(path("length_penalty")), RewardSpec(f"other.{MODULE}:length_penalty")])
    with pytest.raises(ValueError, match="finite number"):
        RewardSpec("math", float("nan"))
    with pytest.raises(RewardImportError, match="no attribute"):
        resolve_specs(None, [RewardSpec("math"), RewardSpec(path("nope"))])


def test_the_module_takes_rewards_and_refuses_both(user_module):
    from ibpo_lit.module import IBPOModule

    module = IBPOModule(rewards=[RewardSpec("math"), RewardSpec(path("length_penalty"), 0.1)])
    assert module.reward_name is None and len(module.reward_specs) == 2
    assert IBPOModule().reward_name == "math"
    with pytest.raises(ValueError, match="not both"):
        IBPOModule(reward="math", rewards=[RewardSpec("math")])
    with pytest.raises(RewardImportError, match="cannot import module"):
        IBPOModule(reward="no_such_pkg.rewards:fn")


# ------------------------------------------------------------------ the pool: batches and failures
def test_an_import_path_reward_gets_prompts_and_columns(user_module):
    golds = ["1", "2", "3"]
    pairs = [(f"the answer is ans-{g}", g) for g in golds]
    with RewardPool(path("echo_columns"), num_workers=2) as pool:
        got = pool.score(pairs, [f"Q:{g}" for g in golds], [{"answer": f"ans-{g}", "level": 3} for g in golds])
        assert got == [1.0, 1.0, 1.0]
        assert pool.score(pairs, [f"Q:{g}" for g in golds], [{"answer": "x", "level": 3}] * 3) == [0.0] * 3
    with RewardPool(path("mentions_answer")) as pool:  # no answer column: answer is the gold
        assert pool.score([("it is 7", "7"), ("it is 8", "7")]) == [1.0, 0.0]
        assert pool.stats == {"ok": 2, "timeout": 0, "error": 0, "none": 0}


def test_one_call_per_batch(user_module):
    pairs = [("x", "1")] * 5
    with RewardPool(path("batch_size"), num_workers=2) as pool:  # 5 over 2 workers: batches of 3 and 2
        assert pool.score(pairs) == [3.0, 3.0, 3.0, 2.0, 2.0]
    with RewardPool(path("batch_size"), num_workers=2, batch_size=2) as pool:
        assert pool.score(pairs) == [2.0, 2.0, 2.0, 2.0, 1.0]
    with RewardPool(path("length_penalty")) as pool:
        assert pool.score([("abcd", "1"), ("", "1")]) == [pytest.approx(-0.04), 0.0]


@pytest.mark.parametrize(
    "fn, message",
    [
        ("raises", "raised ValueError: judge offline, on a batch of 3 response(s)"),
        ("wrong_length", "returned 2 values for 3 completions, on a batch of 3 response(s)"),
        ("not_a_list", "returned a float, not a list of 3 numbers"),
    ],
)
def test_a_failing_batch_is_unscorable_with_one_clear_warning(user_module, caplog, fn, message):
    with RewardPool(path(fn), timeout_s=5) as pool, caplog.at_level(logging.DEBUG, logger="ibpo_lit.rewards.pool"):
        pids = pool.worker_pids
        assert pool.score([("a", "1"), ("b", "1"), ("c", "1")]) == [None, None, None]
        assert pool.score([("a", "1"), ("b", "1"), ("c", "1")]) == [None, None, None]
        assert pool.stats == {"ok": 0, "timeout": 0, "error": 6, "none": 0}
        assert pool.worker_pids == pids  # a failing function does not cost its worker
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # the second batch: DEBUG
    text = warnings[0].getMessage()
    assert f"reward '{MODULE}:{fn}'" in text and message in text and "unscorable" in text
    assert "Traceback" not in caplog.text


def test_non_numbers_are_unscorable_items(user_module, caplog):
    pairs = [(str(i), "1") for i in range(6)]
    with RewardPool(path("odd_values"), num_workers=1) as pool, caplog.at_level(logging.WARNING):
        # "high" and inf are errors; None and NaN are "none"; 1 and True are scores
        assert pool.score(pairs) == [None, 1.0, None, None, None, 1.0]
        assert pool.stats == {"ok": 2, "timeout": 0, "error": 2, "none": 2}
    assert "returned 'high' (str), not a number (response 0; 2 such in this batch)" in caplog.text


def test_a_hanging_batch_is_killed_after_its_size_times_the_timeout(user_module, caplog):
    with RewardPool(path("hangs"), num_workers=1, timeout_s=0.5) as pool, caplog.at_level(logging.WARNING):
        pids = pool.worker_pids
        t0 = time.monotonic()
        assert pool.score([("a", "1"), ("b", "1")]) == [None, None]
        elapsed = time.monotonic() - t0
        assert 1.0 <= elapsed < 1.0 + 3  # 2 responses x 0.5 s
        assert pool.stats["timeout"] == 2 and pool.restarts == 1 and pool.worker_pids != pids
    assert f"reward '{MODULE}:hangs' timed out after 1.0 s on 2 response(s)" in caplog.text


def test_weighted_rewards(user_module):
    specs = [RewardSpec(path("mentions_answer"), 1.0), RewardSpec(path("length_penalty"), 0.5),
             RewardSpec(path("raises"), 0.0)]
    make = lambda name: RewardPool(name, timeout_s=5)  # noqa: E731
    with WeightedRewards(specs, make) as rewards:
        got = rewards.score([("7", "7"), ("no", "7")])
        # 1.0 * 1 + 0.5 * (-0.01) = 0.995; 1.0 * 0 + 0.5 * (-0.02) = -0.01; "raises" has weight 0
        assert got == [pytest.approx(0.995), pytest.approx(-0.01)]
        assert rewards.last_parts == {"mentions_answer": [1.0, 0.0], "length_penalty": [pytest.approx(-0.01),
                                      pytest.approx(-0.02)], "raises": [None, None]}
        assert rewards.unscorable == {"timeout": 0, "error": 2, "none": 0}
        assert rewards.stats["ok"] == 4
    specs[2] = RewardSpec(path("raises"), 0.1)  # now it counts: every response is unscorable
    with WeightedRewards(specs, make) as rewards:
        assert rewards.score([("7", "7"), ("no", "7")]) == [None, None]


# ------------------------------------------------------------------ end to end
@pytest.mark.slow
@pytest.mark.usefixtures("one_intra_op_thread")
def test_a_tiny_fit_with_weighted_import_path_rewards(user_module, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ibpo_lit.__main__ import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    rewards = (f'[{{"name": "{path("mentions_answer")}", "weight": 1.0}}, '
               f'{{"name": "{path("length_penalty")}", "weight": 0.5}}]')
    cli = main(["fit", "--config", os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml"),
                "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path),
                "--trainer.enable_progress_bar", "false", "--model.rewards", rewards, "--model.reward_workers", "2"])
    assert cli.datamodule.task == "custom"  # the task follows the rewards: the user's own, answer-style prompts

    events = next((tmp_path / "lightning_logs" / "version_0").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events))
    acc.Reload()
    logged = {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert len(logged["reward/mentions_answer"]) == len(logged["reward/length_penalty"]) == 2
    assert all(v < 0 for v in logged["reward/length_penalty"])  # every response has characters
    assert logged["train/unscorable"] == [0.0, 0.0]
    for total, answer, length in zip(logged["train/reward"], logged["reward/mentions_answer"],
                                     logged["reward/length_penalty"]):
        assert total == pytest.approx(answer + 0.5 * length, abs=1e-5)  # means of a weighted sum
    assert math.isfinite(logged["train/loss"][-1])


@pytest.mark.slow
@pytest.mark.usefixtures("one_intra_op_thread")
def test_a_tiny_fit_with_a_raising_reward_scores_nan(user_module, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ibpo_lit.__main__ import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    main(["fit", "--config", os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml"),
          "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path),
          "--trainer.enable_progress_bar", "false", "--model.reward", path("raises")])
    events = next((tmp_path / "lightning_logs" / "version_0").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events))
    acc.Reload()
    logged = {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert logged["train/unscorable"] == [16.0]  # 2 prompts x 8 responses, none scored 0
    assert logged["train/reward_errors"][-1] >= 16.0  # corrections, if any, count too
    assert "reward/raises" not in logged  # a mean over no scorable response is not logged


def test_the_cli_parses_rewards(user_module, tmp_path, monkeypatch):
    from ibpo_lit.__main__ import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    base = ["--config", os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml"),
            "--trainer.default_root_dir", str(tmp_path)]
    cli = main([*base, "--model.rewards", '[{"name": "math"}, {"name": "code", "weight": 0.5}]'], run=False)
    assert cli.model.reward_specs == [RewardSpec("math"), RewardSpec("code", 0.5)]
    assert cli.datamodule.task == "code"
    with pytest.raises(ValueError, match="not both"):
        main([*base, "--model.reward", "math", "--model.rewards", '[{"name": "math"}]'], run=False)
    with pytest.raises(RewardImportError, match="cannot import module"):
        main([*base, "--model.reward", "no_such_pkg.rewards:fn"], run=False)
