"""Runs that several scale test files read, run once a session.

Each is ``python -m ibpo_lit fit`` on 2 processes (tests/scale/fit_runs.py), minutes on the CPU:
test_equivalence's FSDP2 run is test_sharded_resume's unbroken HF run, and test_vllm_processes'
TP2 run its unbroken vLLM one, the same command each. The files that share them name the group
``fit_runs.SHARED_FITS`` (tests/conftest.py), so they run on one worker and the run happens once.
"""
from __future__ import annotations

import pytest

from fit_runs import callbacks, recorder, run_fit


@pytest.fixture(scope="session")
def shared_fit(tmp_path_factory):
    """``shared_fit(config, specs, *args)``: the root of ``run_fit(config, root, *args,
    "--trainer.callbacks", [*specs, recorder(root)])``, run on the first call with these arguments
    and handed back on every later one (its ranks' records, weights, logs and checkpoint in the
    root; the tests only read it). A run that failed fails every test that asks for it again,
    without running again."""
    done: dict[tuple, object] = {}

    def run(config: str, specs: tuple[dict, ...], *args: str):
        key = (config, callbacks(*specs), args)
        if key not in done:
            root = tmp_path_factory.mktemp("shared_fit")
            try:
                run_fit(config, root, *args, "--trainer.callbacks", callbacks(*specs, recorder(root)))
                done[key] = root
            except BaseException as failed:  # pytest.fail's Failed is a BaseException
                done[key] = failed
                raise
        if isinstance(done[key], BaseException):
            raise done[key]
        return done[key]

    return run
