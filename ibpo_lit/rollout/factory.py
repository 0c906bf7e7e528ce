"""``build_engine``: the one way a rollout engine is made, for training and for evaluation alike.

``ENGINES`` maps a backend name (``model.rollout.backend``, ``evaluate --backend``) to an
``EngineBackend``; this is the only place that tells ``hf`` from ``vllm``. Training
(``IBPOModule.configure_model``) and evaluation (``ibpo_lit.evaluation.runner``) both call
``build_engine``, so an evaluation samples with exactly the engine, stop tokens, padding and
settings a training run would.

What is covered:
    * ``hf``: ``HFRolloutEngine`` over the policy object itself (no copy, no sync), with the
      FSDP2 plan's ``reshard_after_forward`` for a sharded policy and the decode
      ``rollout.hf_decode`` names (``dynamic`` or ``static``).
    * ``vllm``: ``VLLMRolloutEngine``, a separate copy of the weights. Where its start-up
      weights come from is decided in ``_vllm_engine`` (one rule, explained there).
    * ``vllm_server``: ``VLLMServerEngine``, a vLLM server in its own processes
      (``rollout.vllm.server``), attached to and given the policy's weights by one sync as it
      is built (``_vllm_server_engine``).
    * Stop tokens are ``eos_token_ids(policy, tokenizer)`` and padding the tokenizer's pad id,
      whatever the backend.
    * Every engine is built under the process's plain tensor defaults (`plain_tensor_defaults`),
      whatever context the caller is in: Lightning runs ``configure_model``, where training
      builds its engine, inside ``strategy.tensor_init_context()``.

What is not covered: keeping a vLLM engine on the policy's weights after it is built (training's
``callbacks.VLLMWeightSync`` does that) and shutting it down (its ``close``).
"""
from __future__ import annotations

import dataclasses
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional

from ibpo_lit.registry import Registry

if TYPE_CHECKING:
    from ibpo_lit.rollout.engine import HFDecode, RolloutEngine, SamplingConfig
    from ibpo_lit.rollout.vllm_engine import VLLMConfig

Backend = Literal["hf", "vllm", "vllm_server"]
"""The names in ``ENGINES``, spelled out for the command line's type checks and ``--help``."""


@dataclass(frozen=True)
class EngineSettings:
    """What an engine is built with besides the policy, its tokenizer and the decoding settings;
    a backend ignores what it has no use for.

    Args:
        vllm: The vLLM engine's settings (``rollout.vllm``); None: ``VLLMConfig()``.
        dtype: The policy's dtype, what ``vllm.dtype: auto`` resolves to.
        model_path: A directory or hub id whose files hold the policy's weights as they are now
            (a training run's ``model``); None when no files do (see ``_vllm_engine``).
        reshard_after_forward: The FSDP2 plan's setting for a sharded policy's layers, restored
            after each HF generation.
        stop_strings: The engine will be asked for stop strings (``SamplingConfig.stop``, as
            tool-integrated rollouts do): vLLM then starts its detokenizer, which it skips
            otherwise.
        sync: The collectives a ``vllm_server`` engine's waits agree over (None: the run's
            default process group; ``training.off_policy.producer_sync`` under max_staleness 1).
        hf_decode: The HF engine's decode, ``dynamic`` or ``static`` (``HFRolloutEngine``'s
            ``decode``).
    """

    vllm: Optional[VLLMConfig] = None
    dtype: str = "float32"
    model_path: Optional[str] = None
    reshard_after_forward: bool = True
    stop_strings: bool = False
    sync: Any = None
    hf_decode: HFDecode = "dynamic"


@dataclass(frozen=True)
class EngineBackend:
    """One backend: how its engine is built, and whether that engine holds weights of its own.

    ``build(policy, tokenizer, sampling, settings) -> RolloutEngine``: the contract every entry
    keeps, so no caller branches on the name. ``separate_weights``: the engine samples from a
    copy that must be synced after each update (the policy need not sit on the accelerator the
    engine uses to sample).
    """

    build: Callable[..., RolloutEngine]
    separate_weights: bool


ENGINES = Registry("rollout backend")
"""Backend name -> ``EngineBackend``."""


def build_engine(policy, tokenizer, sampling: SamplingConfig, backend: str, *, vllm: Optional[VLLMConfig] = None,
                 dtype: str = "float32", model_path: Optional[str] = None,
                 reshard_after_forward: bool = True, stop_strings: bool = False, sync: Any = None,
                 hf_decode: HFDecode = "dynamic") -> RolloutEngine:
    """The rollout engine of ``backend`` over ``policy`` (a Hugging Face causal LM, plain, LoRA or
    FSDP2-sharded), sampling with ``sampling`` by default.

    The engine samples from the policy's current weights, except a vLLM engine started from
    ``model_path`` with ``load_format: dummy``: placeholders until the caller's first sync
    (``_vllm_engine`` says why). Under several processes every rank calls it at the same point: building a vLLM engine, and
    syncing a sharded policy's weights into it, are collectives. An unknown ``backend`` raises a
    ``ValueError`` listing the valid names.
    """
    settings = EngineSettings(vllm=vllm, dtype=dtype, model_path=model_path,
                              reshard_after_forward=reshard_after_forward, stop_strings=stop_strings, sync=sync,
                              hf_decode=hf_decode)
    with plain_tensor_defaults():
        return ENGINES.get(backend).build(policy, tokenizer, sampling, settings)


@contextmanager
def plain_tensor_defaults():
    """Tensors made without a ``device=`` or ``dtype=`` go to the CPU in float32 inside, as in a
    process nobody configured, whatever default device or dtype is set around it.

    Why: Lightning calls ``configure_model`` under ``strategy.tensor_init_context()``, which is
    ``with torch.device(root_device)`` for one device and DDP (and a default dtype for the
    ``*-true`` precisions), so that the trained model is made on its GPU. An engine is not the
    trained model: vLLM's GPU model runner makes pinned host buffers with
    ``torch.zeros(..., pin_memory=True)`` and no ``device=``, which under a CUDA default device
    become CUDA tensors and raise. Every engine places its own tensors explicitly, so the plain
    defaults are the ones it was written for. (A new ``torch.device`` context replaces the one
    around it rather than stacking on it: ``torch.utils._device.DeviceContext``.)
    """
    import torch

    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with torch.device("cpu"):
            yield
    finally:
        torch.set_default_dtype(dtype)


def _hf_engine(policy, tokenizer, sampling: SamplingConfig, settings: EngineSettings) -> RolloutEngine:
    from ibpo_lit.models.loading import eos_token_ids
    from ibpo_lit.rollout.hf import HFRolloutEngine  # transformers' generation code is slow to import

    return HFRolloutEngine(policy, eos_token_ids(policy, tokenizer), tokenizer.pad_token_id, sampling,
                           reshard_after_forward=settings.reshard_after_forward, tokenizer=tokenizer,
                           decode=settings.hf_decode)


def _vllm_engine(policy, tokenizer, sampling: SamplingConfig, settings: EngineSettings) -> RolloutEngine:
    """Where vLLM's start-up weights come from, one rule:

    * Files hold the policy's weights (``settings.model_path``: a training run's hub id or local
      directory): vLLM starts from them like any vLLM, reading the weights as ``load_format``
      says. ``auto`` gives real weights from the start with no gather of the policy, what a
      large sharded run may want; ``dummy`` (the default) reads nothing twice and leaves
      placeholders that the caller's first sync replaces (``VLLMWeightSync`` syncs before the
      first rollout of every fit, after any checkpoint restore, so a sync here would be a second
      full gather for nothing).
    * No files do (a model built in code, or weights that exist only in memory: a checkpoint
      loaded for evaluation, a trained policy): vLLM starts from a folder holding only the
      policy's config, with ``load_format: dummy``, and the policy's full weights are synced in
      here, once, so the engine never samples placeholders. This works for a sharded policy too:
      ``iter_full_weights`` of an FSDP2 model is a collective, and every rank builds its engine
      at the same point. The folder belongs to the engine (``model_folder``), removed with it.
    """
    from ibpo_lit.models.loading import eos_token_ids
    from ibpo_lit.rollout.vllm_engine import VLLMConfig, VLLMRolloutEngine

    config = settings.vllm or VLLMConfig()
    eos, pad = eos_token_ids(policy, tokenizer), tokenizer.pad_token_id
    if settings.model_path is not None:
        return VLLMRolloutEngine(settings.model_path, eos, pad, sampling, config, torch_dtype=settings.dtype,
                                 tokenizer=settings.model_path if settings.stop_strings else None)
    folder = tempfile.TemporaryDirectory(prefix="ibpo_lit_engine_")
    # Each rank writes its own folder: the config is all vLLM reads with dummy weights (and the
    # tokenizer, when its detokenizer must find stop strings).
    policy.config.save_pretrained(folder.name)
    if settings.stop_strings:
        tokenizer.save_pretrained(folder.name)
    engine = VLLMRolloutEngine(folder.name, eos, pad, sampling, dataclasses.replace(config, load_format="dummy"),
                               torch_dtype=settings.dtype, tokenizer=folder.name if settings.stop_strings else None)
    engine.model_folder = folder
    return _first_sync(engine, policy, "the vLLM engine")


def _first_sync(engine, policy, what: str):
    """Send ``policy``'s weights into ``engine`` once, refusing a sync that missed a tensor (it
    would keep the engine's placeholder or start-up value)."""
    import torch

    from ibpo_lit.rollout.weights import SyncManifest, iter_full_weights

    manifest = SyncManifest()
    with torch.no_grad():
        engine.sync_weights(iter_full_weights(policy, manifest, dtype=engine.weights_dtype))
    if manifest.missing():
        raise RuntimeError(f"{what}'s first sync did not send {len(manifest.missing())} of the policy's "
                           f"tensors ({', '.join(manifest.missing()[:5])}): they would keep placeholder values")
    return engine


def _vllm_server_engine(policy, tokenizer, sampling: SamplingConfig, settings: EngineSettings) -> RolloutEngine:
    """Attach to the server and sync the policy's weights into it once: the server started from
    its own files, which need not be the policy's (a model built in code, a checkpoint, a resumed
    run), and an evaluation samples right away. (Training's ``VLLMWeightSync`` syncs again before
    the first rollout of a fit: one sync more than needed at start, for one rule.)"""
    import torch

    from ibpo_lit.models.loading import eos_token_ids
    from ibpo_lit.rollout.vllm_engine import VLLMConfig
    from ibpo_lit.rollout.vllm_server import VLLMServerEngine
    from ibpo_lit.rollout.weights import _unique_tensors

    config = settings.vllm or VLLMConfig()
    dtype = getattr(torch, settings.dtype if config.dtype == "auto" else config.dtype)
    weight_bytes = sum(t.numel() for _, t in _unique_tensors(policy)) * dtype.itemsize
    engine = VLLMServerEngine(config.server, eos_token_ids(policy, tokenizer), tokenizer.pad_token_id, sampling,
                              weights_dtype=dtype, weight_bytes=weight_bytes, policy=policy, sync=settings.sync)
    return _first_sync(engine, policy, "the vLLM server")


ENGINES.register("hf")(EngineBackend(build=_hf_engine, separate_weights=False))
ENGINES.register("vllm")(EngineBackend(build=_vllm_engine, separate_weights=True))
ENGINES.register("vllm_server")(EngineBackend(build=_vllm_server_engine, separate_weights=True))
