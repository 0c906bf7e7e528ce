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


# Code fixtures in the upstream formats. MBPP: task 2 is in the "prompt" split and 601 in
# "train", so the default (test) split keeps tasks 11 and 12 only.
MBPP_TASKS = [
    {"task_id": 2, "text": "Write a function to negate x.", "code": "def neg(x):\r\n  return -x",
     "test_list": ["assert neg(1) == -1"], "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 11, "text": "Write a function to add two numbers.", "code": "def add(a, b):\r\n  return a + b",
     "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 12, "text": "Write a function to square a number.", "code": "def square(x):\r\n  return x * x",
     "test_list": ["assert square(2) == 4", "assert square(3) == 9"], "test_setup_code": "",
     "challenge_test_list": []},
    {"task_id": 601, "text": "Write a function to double x.", "code": "def double(x):\r\n  return 2 * x",
     "test_list": ["assert double(2) == 4"], "test_setup_code": "", "challenge_test_list": []},
]
HUMANEVAL_TASKS = [
    {"task_id": "Toy/0", "prompt": 'def add(a, b):\n    """Return a + b."""\n', "entry_point": "add",
     "canonical_solution": "    return a + b\n",
     "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"},
    {"task_id": "Toy/1", "prompt": 'def square(x):\n    """Return x squared."""\n', "entry_point": "square",
     "canonical_solution": "    return x * x\n",
     "test": "def check(candidate):\n    assert candidate(3) == 9\n"},
]


@pytest.fixture
def mbpp_path(tmp_path):
    """MBPP-format JSONL of 4 tasks (ids 2, 11, 12, 601); read it with benchmark name ``mbpp``."""
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in MBPP_TASKS))
    return str(path)


@pytest.fixture
def humaneval_path(tmp_path):
    """HumanEval-format JSONL of 2 problems; read it with benchmark name ``humaneval``."""
    path = tmp_path / "humaneval.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in HUMANEVAL_TASKS))
    return str(path)
