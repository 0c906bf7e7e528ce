"""The Python tool (ibpo_lit/rewards/python_tool.py): cells run in the code sandbox, with state
within one rollout only, and the attacks a policy would try from a cell."""
import pytest

from ibpo_lit.rewards.code import SandboxUnavailable, detect_isolation
from ibpo_lit.rewards.python_tool import PythonTool, replay_program


@pytest.fixture(scope="module")
def tool():
    try:
        detect_isolation()
    except SandboxUnavailable as e:
        pytest.skip(f"the sandbox cannot run here: {e}")
    t = PythonTool(timeout_s=3.0, workers=2, max_output_chars=400)
    yield t
    t.close()


def run(tool, *cells):
    return tool([list(cells)])[0]


def test_state_carries_within_a_rollout_and_earlier_output_is_not_shown(tool):
    r = run(tool, "x = 6 * 7\nprint('first')", "import math\ndef f(v):\n    return v + 1", "print(f(x)); math.pi > 3")
    assert (r.text, r.status) == ("43\nTrue\n", "pass")


def test_a_cells_last_expression_is_shown_unless_none(tool):
    assert run(tool, "1 + 1").text == "2\n"
    assert run(tool, "'a' * 3").text == "'aaa'\n"
    assert run(tool, "None").text == ""
    assert run(tool, "x = 5").text == ""


def test_errors_show_the_cells_own_traceback(tool):
    r = run(tool, "y = 1", "y / 0")
    assert r.status == "error" and r.failed
    assert 'File "<cell 2>", line 1' in r.text and r.text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "<solution>" not in r.text and "_ibpo_" not in r.text
    s = run(tool, "def f(:")
    assert s.status == "error" and "SyntaxError" in s.text and "ast.py" not in s.text


def test_an_earlier_failing_cell_does_not_stop_the_replay(tool):
    assert run(tool, "a = 1\nraise ValueError('no')", "import sys; sys.exit(3)", "print(a)").text == "1\n"


def test_limits_time_memory_and_output(tool):
    slow = run(tool, "print('started')\nwhile True: pass")
    assert slow.status == "timeout" and slow.text.startswith("started\n") and "TimeoutError" in slow.text
    big = run(tool, "x = bytearray(2 << 30)")
    assert big.status in ("memory", "error") and "MemoryError" in big.text
    flood = run(tool, "while True: print('y' * 1000)")
    assert flood.failed and len(flood.text) <= 400 and flood.text.endswith("(output truncated)\n")
    long = run(tool, "print('z' * 5000)")
    assert long.status == "pass" and len(long.text) <= 400


def test_nothing_carries_between_rollouts(tool):
    """Two rollouts' cells never share an interpreter or a file."""
    first, second = tool([["open('/tmp/note', 'w').write('secret'); print('wrote')"],
                          ["import os; print(os.path.exists('/tmp/note'))"]])
    assert first.text == "wrote\n" and second.text == "False\n"
    assert run(tool, "import os; print(os.path.exists('/tmp/note'))").text == "False\n"


def test_the_host_and_the_network_are_out_of_reach(tool, tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"answer": "42"}')
    r = run(tool, f"print(open({str(gold)!r}).read())")
    assert r.status == "error" and "42" not in r.text
    net = run(tool, "import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=1)\nprint('connected')")
    assert net.status == "error" and "connected" not in net.text
    env = run(tool, "import os; print(sorted(os.environ))")
    assert "HF_HOME" not in env.text and "CUDA" not in env.text


def test_the_wrapper_names_are_not_the_cells(tool):
    assert run(tool, "print(sorted(n for n in globals() if not n.startswith('__')))").text == "['_ibpo_run']\n"


def test_replay_program_needs_a_cell():
    with pytest.raises(ValueError, match="at least one cell"):
        replay_program([])


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="timeout_s"):
        PythonTool(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        PythonTool(memory_mb=1)
