"""Load a policy (model + tokenizer) by built-in name, local directory or hub id.

What is covered:
    * Built-in names (``BUILTIN_MODELS``: ``tiny-llama``, ``tiny-qwen3``) build a random model
      in code; no files, no network.
    * Fetched names (``FETCHED_MODELS``: ``smollm2-135m-instruct``) are downloaded and
      converted once into a local cache (see ``smollm2.py``), then loaded from that directory
      like any other; ``resolve_model_path`` gives the directory.
    * Anything else goes through ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``:
      a local directory written by ``save_pretrained``, or a hub id.
    * Errors a user can act on: a local-looking path that does not exist (or, for a model,
      a directory without ``config.json``) raises ``ModelNotFoundError``, a
      ``FileNotFoundError`` naming it; ``check_model_path`` runs that check at config time
      without loading anything. A name is local-looking when it starts with ``.``, ``/`` or
      ``~``, is an existing directory, has more than one ``/`` (a hub id has exactly one), or
      its first component is an existing directory (``runs/model``). A hub id that cannot be
      loaded raises ``ModelLoadError``, an ``OSError`` naming the id, the cause and the
      alternatives.
    * Dropout is switched off (see ``disable_dropout``) and the tokenizer gets a pad token.

    * Sharded loading (``load_sharded_policy``, under ``FSDP2Strategy``): every rank builds the
      model on the meta device and shards it; only global rank 0 reads the weights, and they
      reach the others one tensor at a time (``ibpo_lit.scale.fsdp2.build_sharded``).

What is not covered:
    * GGUF files, PEFT adapters, quantised checkpoints: convert to a plain directory first.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator, Optional

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ibpo_lit.errors import ModelLoadError, ModelNotFoundError
from ibpo_lit.models.attention import check_attn_implementation
from ibpo_lit.models.smollm2 import SMOLLM2_NAME, fetch_smollm2
from ibpo_lit.models.tiny import build_tiny_model, build_tiny_tokenizer

BUILTIN_MODELS: dict[str, Callable[[int], PreTrainedModel]] = {
    "tiny-llama": partial(build_tiny_model, arch="llama"),
    "tiny-qwen3": partial(build_tiny_model, arch="qwen3"),
}
"""Built-in model name -> ``builder(seed) -> model``; all use ``build_tiny_tokenizer()``."""

FETCHED_MODELS: dict[str, Callable[[], os.PathLike]] = {SMOLLM2_NAME: fetch_smollm2}
"""Built-in name -> ``fetch() -> directory``: pretrained models converted once into a cache."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Config fields that hold a dropout probability, across common architectures.
DROPOUT_FIELDS = (
    "attention_dropout",
    "hidden_dropout",
    "dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "activation_dropout",
)


def load_policy(
    name_or_path: str, dtype: str = "float32", seed: int = 0, attn_implementation: Optional[str] = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer named by ``name_or_path``.

    Args:
        name_or_path: A built-in name (see ``BUILTIN_MODELS``, ``FETCHED_MODELS``), a local
            directory holding a ``save_pretrained`` model and tokenizer, or a Hugging Face hub
            id.
        dtype: Parameter dtype: ``float32``, ``bfloat16`` or ``float16``.
        seed: Weight seed of built-in models (ignored for pretrained ones).
        attn_implementation: transformers' attention implementation (``model.attn_implementation``);
            None keeps the model's default (SDPA).

    Returns:
        ``(model, tokenizer)``; the model has dropout disabled, the tokenizer a pad token.
    """
    torch_dtype = _torch_dtype(dtype)
    if name_or_path in BUILTIN_MODELS:
        return set_attention(build_builtin_model(name_or_path, dtype, seed), attn_implementation), build_tiny_tokenizer()

    source = resolve_model_path(name_or_path)
    with _hub_errors(source):
        tokenizer = AutoTokenizer.from_pretrained(source)
        config = AutoConfig.from_pretrained(source)
        disable_dropout(config)
        model = AutoModelForCausalLM.from_pretrained(source, config=config, dtype=torch_dtype)
    set_attention(model, attn_implementation)
    disable_dropout(model)
    _ensure_pad_token(tokenizer)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def build_builtin_model(name: str, dtype: str = "float32", seed: int = 0) -> PreTrainedModel:
    """A built-in model (``BUILTIN_MODELS``) in ``dtype``, rotary buffers kept in float32."""
    from ibpo_lit.scale.fsdp2 import fp32_rotary_buffers

    model = BUILTIN_MODELS[name](seed).to(_torch_dtype(dtype))
    fp32_rotary_buffers(model)  # .to(bfloat16) casts the rotary inv_freq too
    return model


def load_sharded_policy(
    name_or_path: str, plan, dtype: str = "float32", seed: int = 0, attn_implementation: Optional[str] = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``load_policy``'s model and tokenizer, sharded with FSDP2 by ``plan``
    (``ibpo_lit.scale.fsdp2.FSDP2Plan``) without a full copy of the weights on any rank but
    global rank 0 (which reads them once); its attention set before sharding."""
    from ibpo_lit.scale.fsdp2 import build_sharded

    torch_dtype = _torch_dtype(dtype)
    if name_or_path in BUILTIN_MODELS:

        def build_meta() -> PreTrainedModel:
            return set_attention(BUILTIN_MODELS[name_or_path](seed).to(torch_dtype), attn_implementation)

        def full_state_dict() -> dict[str, torch.Tensor]:
            return build_builtin_model(name_or_path, dtype, seed).state_dict()

        model = build_sharded(build_meta, full_state_dict, plan)
        return model, build_tiny_tokenizer()

    source = resolve_model_path(name_or_path)
    with _hub_errors(source):
        tokenizer = AutoTokenizer.from_pretrained(source)
        config = AutoConfig.from_pretrained(source)
    disable_dropout(config)

    def build_meta() -> PreTrainedModel:
        return set_attention(AutoModelForCausalLM.from_config(config, dtype=torch_dtype), attn_implementation)

    def full_state_dict() -> dict[str, torch.Tensor]:
        with _hub_errors(source):
            return AutoModelForCausalLM.from_pretrained(source, config=config, dtype=torch_dtype).state_dict()

    model = build_sharded(build_meta, full_state_dict, plan)
    disable_dropout(model)
    _ensure_pad_token(tokenizer)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def set_attention(model: PreTrainedModel, attn_implementation: Optional[str]) -> PreTrainedModel:
    """``model`` with ``attn_implementation`` (None: unchanged), set through transformers
    (``set_attn_implementation``), which refuses a kernel that is not installed."""
    if attn_implementation is not None:
        check_attn_implementation(attn_implementation)
        model.set_attn_implementation(attn_implementation)
    return model


def model_config(name_or_path: str):
    """The model's ``PretrainedConfig``, read without weights and without a download: a built-in
    model's, a fetched or local model's ``config.json``, a hub model's from the local Hugging Face
    cache, else the hub's values for the shipped configs' models
    (`ibpo_lit.models.known_configs`); None when none of them has it."""
    from ibpo_lit.models.known_configs import known_config
    from ibpo_lit.models.smollm2 import is_complete, model_dir
    from ibpo_lit.models.tiny import tiny_config

    try:
        if name_or_path in BUILTIN_MODELS:
            return tiny_config("qwen3" if "qwen3" in name_or_path else "llama")
        if name_or_path in FETCHED_MODELS:
            return AutoConfig.from_pretrained(str(model_dir())) if is_complete(model_dir()) else None
        local = _looks_local(name_or_path)
        path = os.path.expanduser(name_or_path) if local else name_or_path
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        return known_config(name_or_path)


def model_context_length(name_or_path: str) -> Optional[int]:
    """The model's ``max_position_embeddings`` (`model_config`); None when it cannot be read offline."""
    config = model_config(name_or_path)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of ``load_policy(name_or_path)``, without loading weights."""
    if name_or_path in BUILTIN_MODELS:
        return build_tiny_tokenizer()
    source = resolve_model_path(name_or_path)
    with _hub_errors(source):
        tokenizer = AutoTokenizer.from_pretrained(source)
    _ensure_pad_token(tokenizer)
    return tokenizer


def disable_dropout(config_or_model) -> None:
    """Set every dropout probability to 0, in a config or in a model's modules.

    RL trainers do this (verl, TRL's ``disable_dropout``): the importance ratio compares the
    log-probs the sampler saw with those the trainer computes, and both must come from the same
    deterministic function of the weights. With dropout on, the training forward would be a
    random perturbation of the policy and the ratio would be noisy even for on-policy data.
    """
    if isinstance(config_or_model, torch.nn.Module):
        for module in config_or_model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        disable_dropout(config_or_model.config)
        return
    configs = [config_or_model]
    if hasattr(config_or_model, "get_text_config"):
        text_config = config_or_model.get_text_config()
        if text_config is not config_or_model:
            configs.append(text_config)
    for config in configs:
        for field in DROPOUT_FIELDS:
            if isinstance(getattr(config, field, None), float):
                setattr(config, field, 0.0)


def _torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {list(DTYPES)}")
    return DTYPES[dtype]


def _looks_local(name_or_path: str) -> bool:
    if name_or_path.startswith((".", "/", "~")) or os.path.isdir(name_or_path):
        return True
    if "\\" in name_or_path or name_or_path.count("/") > 1:  # a hub id is "org/name"
        return True
    head = name_or_path.split("/", 1)[0]
    return "/" in name_or_path and os.path.isdir(head)  # "runs/model" beside a runs/ folder


def _builtin_names() -> str:
    return ", ".join([*BUILTIN_MODELS, *FETCHED_MODELS])


def resolve_model_path(name_or_path: str) -> str:
    """What ``from_pretrained`` loads for ``name_or_path``: a local directory or a hub id.

    A fetched built-in name (``smollm2-135m-instruct``) is fetched and converted on first use
    and resolves to its cache directory; a local-looking path is checked to be a directory;
    anything else is returned as a hub id. The in-code tiny models have no path: ``ValueError``.
    """
    if name_or_path in BUILTIN_MODELS:
        raise ValueError(f"{name_or_path!r} is built in code and has no model path")
    if name_or_path in FETCHED_MODELS:
        return str(FETCHED_MODELS[name_or_path]())
    if not _looks_local(name_or_path):
        return name_or_path
    return check_model_path(name_or_path, require_config=False)


def model_files(name_or_path: str) -> Optional[str]:
    """``resolve_model_path``, or None for a model built in code (no files hold its weights)."""
    return None if name_or_path in BUILTIN_MODELS else resolve_model_path(name_or_path)


def check_model_path(name_or_path: str, require_config: bool = True) -> str:
    """Check, without loading or fetching anything, that a local-looking ``name_or_path`` is a
    model directory; returns the expanded path (or ``name_or_path`` itself when it is a built-in
    name or a hub id, which cannot be checked offline).

    Raises:
        ModelNotFoundError: the path does not exist, is a file, or (with ``require_config``,
            the model's case, not a lone tokenizer's) has no ``config.json``.
    """
    if name_or_path in BUILTIN_MODELS or name_or_path in FETCHED_MODELS or not _looks_local(name_or_path):
        return name_or_path
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path):
        if not require_config or os.path.isfile(os.path.join(path, "config.json")):
            return path
        what = "is a directory without config.json"
    else:
        what = "is a file" if os.path.exists(path) else "does not exist"
    raise ModelNotFoundError(
        f"model path {name_or_path!r} {what}: expected a directory written by "
        f"save_pretrained (config.json, weights and tokenizer files), a Hugging Face hub id, "
        f"or a built-in name: {_builtin_names()}"
    )


@contextmanager
def _hub_errors(name_or_path: str) -> Iterator[None]:
    """Re-raise a hub id's loading failure as a ``ModelLoadError`` (an ``OSError``) that says
    what to do instead."""
    try:
        yield
    except OSError as exc:
        if _looks_local(name_or_path):
            raise
        raise ModelLoadError(
            f"could not load model {name_or_path!r} from the Hugging Face hub: {exc}; pass a "
            f"local directory or a built-in name: {_builtin_names()}"
        ) from exc


def _ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> None:
    if tokenizer.pad_token is not None:
        return
    if tokenizer.eos_token is None:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an eos token; "
            "the rollout engine needs one to pad and stop responses"
        )
    tokenizer.pad_token = tokenizer.eos_token


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS plus the generation config's (chat
    models often end turns with a token the tokenizer does not call EOS). Training and
    evaluation stop rollouts on the same set."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    return sorted(i for i in ids if i is not None)
