"""Fixtures of the reward tests."""
import pytest

from ibpo_lit.rewards.code import detect_isolation


@pytest.fixture(scope="module")
def isolated():
    """This host's full isolation (bwrap and a per-run uid: root); the test is skipped without it."""
    iso = detect_isolation()
    if not (iso.bwrap and iso.per_run_uid):
        pytest.skip(f"needs bwrap and a per-run uid (root); missing: {iso.gaps}")
    return iso


@pytest.fixture(scope="module")
def sandbox():
    """This host's isolation with bwrap (the code sandbox and the tool's); skipped without bwrap."""
    iso = detect_isolation()
    if not iso.bwrap:
        pytest.skip("no bwrap")
    return iso
