"""A trained policy out of its Lightning checkpoint, as a Hugging Face model folder.

- ``read_checkpoint``: a checkpoint as one dict (``state_dict``, ``hyper_parameters``, ...), from
  a single file or from the folder a sharded run (``FSDP2Strategy``) writes: torch's distributed
  checkpoint plus Lightning's ``meta.pt``. The folder is consolidated with torch's own
  ``dcp_to_torch_save`` (the format's reference reader) into a temporary file, so it needs the
  whole checkpoint (optimizer state included) in memory once.
- ``trained_policy``: the model the checkpoint was trained from (``hyper_parameters["model"]``,
  or ``model`` to point elsewhere) with the trained weights loaded strictly; a LoRA checkpoint
  (adapters only) gets its adapters put on the base and merged in.
- ``export``: ``save_pretrained`` (safetensors, config, generation config) and the tokenizer
  with its chat template into a folder that transformers and vLLM load as they load any model.
- ``push_to_hub``: upload that folder. A push that fails (offline, not logged in, no access to
  the repository) raises `HubPushError`: one line saying the folder is written, why the push
  failed in a few words, and the ``hf upload`` command that pushes it later. Only the hub's and
  the network's errors are caught (`huggingface_hub`'s, httpx's, requests', ``OSError``);
  anything else keeps its traceback.

Checkpoints pickle their hyperparameters (the config dataclasses), so they are read with
``weights_only=False``: export only checkpoints you trust.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from ibpo_lit.errors import HubPushError

POLICY_PREFIX = "policy."
SHARDED_METADATA = "meta.pt"  # Lightning's ModelParallelStrategy writes the non-tensor state here


def read_checkpoint(ckpt_path: str) -> dict[str, Any]:
    """The checkpoint at ``ckpt_path`` (a file, or a sharded checkpoint's folder) on the CPU."""
    path = Path(ckpt_path)
    if path.is_dir():
        if not (path / ".metadata").is_file() or not (path / SHARDED_METADATA).is_file():
            raise ValueError(f"{ckpt_path!r} is a folder but not a sharded checkpoint (no .metadata and meta.pt)")
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory(prefix="ibpo_lit_consolidate_") as tmp:
            full = os.path.join(tmp, "full.pt")
            dcp_to_torch_save(str(path), full)
            tensors = torch.load(full, map_location="cpu", weights_only=False)
        ckpt = torch.load(path / SHARDED_METADATA, map_location="cpu", weights_only=False)
        ckpt["state_dict"] = tensors["state_dict"]
        return ckpt
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint {ckpt_path!r} (e.g. <default_root_dir>/checkpoints/last.ckpt)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - truncated, not a torch file, ...: one message
        raise ValueError(f"{ckpt_path!r} is not a readable checkpoint: {type(err).__name__}: {err}") from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"{ckpt_path!r} is not a Lightning checkpoint: no 'state_dict' entry")
    return ckpt


def policy_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of ``state_dict`` under ``policy.``, with that prefix removed."""
    return {key[len(POLICY_PREFIX):]: value for key, value in state_dict.items() if key.startswith(POLICY_PREFIX)}


def load_trained_weights(model: torch.nn.Module, ckpt: dict[str, Any], ckpt_path: str = "") -> torch.nn.Module:
    """``model`` (the base the run started from) with ``ckpt``'s trained policy; a LoRA
    checkpoint's adapters are applied and merged. Returns the plain model."""
    weights = policy_state_dict(ckpt["state_dict"])
    hparams = ckpt.get("hyper_parameters") or {}
    trained_from = hparams.get("model", "unknown")
    if not weights:
        raise ValueError(f"{ckpt_path!r} has no '{POLICY_PREFIX}*' weights; was it written by IBPOModule?")
    lora = hparams.get("lora")
    if lora is not None:
        from ibpo_lit.models.lora import LoRAConfig, adapter_state, apply_lora

        # The command line saves hyperparameters as plain dicts; Python callers may pass the dataclass.
        model = apply_lora(model, LoRAConfig(**lora) if isinstance(lora, dict) else lora)
        expected = adapter_state(model)
        if set(weights) != expected:
            raise ValueError(f"checkpoint {ckpt_path!r}: its LoRA adapters do not fit {trained_from!r} with "
                             f"model.lora={lora} ({len(expected - set(weights))} missing)")
        model.load_state_dict(weights, strict=False)
        return model.merge_and_unload()
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {ckpt_path!r} does not fit the model: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{' ...' if len(unexpected) > 5 else ''}; it was trained from model {trained_from!r}, pass that"
        )
    model.load_state_dict(weights, strict=True)
    return model


def trained_policy(ckpt_path: str, model: Optional[str] = None, dtype: Optional[str] = None):
    """``(model, tokenizer)``: the checkpoint's trained policy, in eval mode on the CPU."""
    from ibpo_lit.models.loading import load_policy

    ckpt = read_checkpoint(ckpt_path)
    hparams = ckpt.get("hyper_parameters") or {}
    name = model or hparams.get("model")
    if name is None:
        raise ValueError(f"{ckpt_path!r} does not say which model it was trained from: pass --model")
    dtype = dtype or hparams.get("dtype", "float32")
    # Built-in models are made from the run's seed: a LoRA checkpoint's base is that model. The
    # seed the run resolved (`ibpo_lit.seeds`); older checkpoints: the configured rollout.seed.
    rollout = hparams.get("rollout")
    seed = (rollout.get("seed", 0) if isinstance(rollout, dict) else getattr(rollout, "seed", 0)) or 0
    seed = (ckpt.get("ibpo_lit") or {}).get("seeds", {}).get("model.rollout.seed", seed)
    base, tokenizer = load_policy(name, dtype=dtype, seed=seed)
    return load_trained_weights(base, ckpt, ckpt_path).eval(), tokenizer


def export(ckpt_path: str, output_dir: str, model: Optional[str] = None, dtype: Optional[str] = None,
           overwrite: bool = False) -> str:
    """Write the checkpoint's policy as a Hugging Face folder; returns the folder."""
    out = Path(output_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise FileExistsError(f"output_dir {output_dir!r} exists and is not empty (pass --overwrite)")
    policy, tokenizer = trained_policy(ckpt_path, model, dtype)
    out.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)  # with its chat template
    return str(out)


def check_repo_id(repo_id: str) -> None:
    """Raise ``ValueError`` for a name the hub would refuse (before any export work is done)."""
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as err:  # HFValidationError
        raise ValueError(f"--push_to_hub {repo_id!r} is not a hub repository id (user/name): {err}") from None


def push_to_hub(folder: str, repo_id: str, private: bool = False) -> str:
    """Upload ``folder`` to the Hugging Face hub as model ``repo_id`` (created if needed).

    Raises:
        HubPushError: the hub could not be reached or refused (the message says the folder is
            kept, the cause, and the command that pushes it later).
    """
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(folder_path=folder, repo_id=repo_id, repo_type="model")
    except _hub_errors() as err:
        later = f"hf upload {repo_id} {folder} .{' --private' if private else ''}"
        raise HubPushError(
            f"the model folder was written to {folder} (nothing is lost), but pushing it to the hub as "
            f"{repo_id!r} failed: {push_failure(err, repo_id)}. Push it later with `{later}`, or rerun "
            "this export with --push_to_hub once that is fixed"
        ) from err
    return f"https://huggingface.co/{repo_id}"


def _hub_errors() -> tuple[type[BaseException], ...]:
    """What a failed push raises: the hub's errors are ``OSError``s, the HTTP clients' are not
    (whichever of httpx, httpx2 and requests this huggingface_hub uses)."""
    import importlib

    errors: list[type[BaseException]] = [OSError]
    for module, name in (("httpx", "HTTPError"), ("httpx2", "HTTPError"), ("requests", "RequestException"),
                         ("huggingface_hub.errors", "HfHubHTTPError")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def push_failure(err: BaseException, repo_id: str) -> str:
    """Why a push failed, in a few words: the HTTP status the hub answered, or no answer at all."""
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    if type(err).__name__ == "LocalTokenNotFoundError" or status == 401:
        return "not logged in, or the token is not valid (run `hf auth login` or set HF_TOKEN)"
    if status == 403:
        return f"the token may not write to {repo_id!r} (a read-only token, or another user's or organisation's name)"
    if status == 404:
        return f"no access to {repo_id!r} (it does not exist, or this token cannot see it)"
    if status is not None:
        return f"the hub answered HTTP {status}"
    if type(err).__name__ == "OfflineModeIsEnabled":
        return "offline mode is on (HF_HUB_OFFLINE)"
    detail = " ".join(str(err).split())[:200] or type(err).__name__
    if isinstance(err, (PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return f"a local file could not be read ({type(err).__name__}: {detail})"  # not the network
    from huggingface_hub import constants

    return f"the hub at {constants.ENDPOINT} could not be reached (offline? {type(err).__name__}: {detail})"
