"""RewardPool: same scores as in-process, hard timeouts by killing, recovery, parent death."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from ibpo_lit.rewards import RewardPool, math_score, math_score_inprocess, math_scores

TESTING = ["misbehaving_rewards"]  # registers "sleep", "busy_c", "raise", "none", "mixed"
TIMEOUT = 1.0

CASES = [
    ("7 + 4 = 11\n#### 11", "11"),
    ("7 + 4 = 12\n#### 12", "11"),
    ("#### 1,234", "1234"),
    ("#### $42$ apples", "42"),
    ("The answer is 41. Wait, no.\n#### 42\nSome rambling 17", "42"),
    ("So the result is \\boxed{\\frac{1}{2}}.", "0.5"),
    ("So the result is \\boxed{\\frac{1}{3}}.", "\\frac{1}{2}"),
    ("#### 0.5", "\\frac{1}{2}"),
    ("12 apples and then 13, so 25.", "25"),
    ("the answer is \\boxed{7}\n#### ", "7"),
    ("I do not know.", "42"),
    ("", "42"),
    ("#### 42", "\\frac{"),  # unparseable gold: None
    ("#### 42", "   "),
    ("\\boxed{2^{25} \\cdot 26!}", "2^{25} \\cdot 26!"),
    ("\\boxed{\\sqrt{\\frac{95}{24}}}", "\\sqrt{\\frac{95}{24}}"),
    ("\\boxed{1-\\frac{2}{\\pi}}", "1-\\frac{2}{\\pi}"),
    ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("#### -5", "-5"),
    ("#### 5", "-5"),
]


@pytest.fixture(scope="module")
def mixed_pool():
    """Two workers; completion "SLEEP"/"BUSY"/"RAISE"/"NONE" misbehaves, anything else is math."""
    with RewardPool("mixed", num_workers=2, timeout_s=TIMEOUT, import_modules=TESTING) as pool:
        yield pool


def test_scores_match_in_process():
    expected = [math_score_inprocess(c, g) for c, g in CASES]
    assert None in expected and 0.0 in expected and 1.0 in expected
    with RewardPool("math", num_workers=2) as pool:
        assert pool.score(CASES) == expected
        assert pool.stats == {"ok": expected.count(1.0) + expected.count(0.0), "timeout": 0, "error": 0,
                              "none": expected.count(None)}
    assert math_scores([c for c, _ in CASES], [g for _, g in CASES]) == expected
    assert [math_score(c, g) for c, g in CASES[:3]] == expected[:3]
    assert math_scores([], []) == []


def test_math_scores_length_mismatch():
    with pytest.raises(ValueError, match="2 completions but 1 golds"):
        math_scores(["a", "b"], ["1"])


# A hang sleeps 100 s: ending well before that shows it was killed. The margin is wide because on a
# loaded machine the kill and the reply take seconds (seen: over 3 s at load ~20); how fast the
# pool is belongs to benchmarks, not to a test's clock.
KILLED_WITHIN_S = TIMEOUT + 20


@pytest.mark.parametrize("misbehaviour", ["SLEEP", "BUSY"])  # BUSY: a C loop SIGALRM cannot stop
def test_hung_item_is_killed_and_the_pool_recovers(mixed_pool, misbehaviour):
    assert mixed_pool.score([("#### 1", "1")]) == [1.0]  # the workers are up: their start is not timed
    before = dict(mixed_pool.stats)
    pids, restarts = mixed_pool.worker_pids, mixed_pool.restarts
    t0 = time.monotonic()
    assert mixed_pool.score([(misbehaviour, "1")]) == [None]
    elapsed = time.monotonic() - t0
    assert TIMEOUT <= elapsed < KILLED_WITHIN_S
    assert mixed_pool.stats["timeout"] == before["timeout"] + 1
    assert mixed_pool.restarts == restarts + 1
    assert len(set(mixed_pool.worker_pids) - set(pids)) == 1  # one worker replaced
    # the next items are scored correctly (the fresh worker included)
    assert mixed_pool.score([("#### 3", "3"), ("#### 4", "5"), ("#### 5", "5")]) == [1.0, 0.0, 1.0]


def test_slow_item_does_not_stall_the_others(mixed_pool):
    pairs = [("SLEEP", "1")] + [(f"#### {k}", str(k)) for k in range(12)] + [("#### 1", "2")]
    t0 = time.monotonic()
    results = mixed_pool.score(pairs)
    assert time.monotonic() - t0 < KILLED_WITHIN_S  # (a stalled pool would wait out the 100 s sleep)
    assert results == [None] + [1.0] * 12 + [0.0]


def test_raise_and_none_are_unscorable(mixed_pool):
    before = dict(mixed_pool.stats)
    pids = mixed_pool.worker_pids
    assert mixed_pool.score([("RAISE", "1"), ("NONE", "1"), ("#### 2", "2")]) == [None, None, 1.0]
    assert mixed_pool.stats["error"] == before["error"] + 1
    assert mixed_pool.stats["none"] == before["none"] + 1
    assert mixed_pool.stats["ok"] == before["ok"] + 1
    assert mixed_pool.worker_pids == pids  # an exception does not cost a worker


def test_named_test_rewards():
    with RewardPool("raise", timeout_s=TIMEOUT, import_modules=TESTING) as pool:
        assert pool.score([("x", "1")]) == [None]
        assert pool.stats["error"] == 1
    with RewardPool("none", timeout_s=TIMEOUT, import_modules=TESTING) as pool:
        assert pool.score([("x", "1")]) == [None]
        assert pool.stats["none"] == 1


def test_workers_stay_light():
    with RewardPool("heavy_imports", import_modules=TESTING) as pool:
        assert pool.score([("x", "1")]) == [0.0]  # no torch, lightning or transformers


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"unknown reward 'nope'; valid: .*math"):
        RewardPool("nope")
    with pytest.raises(ValueError, match="num_workers"):
        RewardPool("math", num_workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        RewardPool("math", timeout_s=0)


def test_close():
    pool = RewardPool("math")
    pids = pool.worker_pids
    assert pool.score([("#### 1", "1")]) == [1.0]
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pool.score([("#### 1", "1")])
    for pid in pids:
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_worker_dies_with_its_parent():
    script = textwrap.dedent(
        f"""
        from ibpo_lit.rewards import RewardPool
        pool = RewardPool("mixed", timeout_s=100, import_modules={TESTING!r})
        assert pool.score([("#### 1", "1")]) == [1.0]  # the worker is up
        print(pool.worker_pids[0], flush=True)
        pool.score([("BUSY", "1")])  # the worker is stuck in C code when the parent is killed
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    worker = int(parent.stdout.readline())
    time.sleep(0.5)  # let the worker take the item
    assert _alive(worker)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)
