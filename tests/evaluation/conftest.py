"""A 3-problem benchmark file in MATH-500's format (``problem``, LaTeX ``answer``)."""
import json

import pytest
import torch

PROBLEMS = [
    {"problem": "What is 2 + 3?", "answer": "5"},
    {"problem": "What is 7 * 6?", "answer": "42"},
    {"problem": "Half of 1?", "answer": "\\frac{1}{2}"},
]


@pytest.fixture
def bench_path(tmp_path):
    """Path of the 3-problem JSONL; read it with benchmark name ``math500``."""
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    return str(path)


@pytest.fixture(autouse=True)
def one_thread():
    """The tiny model gains nothing from several threads, and on a busy machine their
    spin-waits cost more than its matmuls (about 5x here). Restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
