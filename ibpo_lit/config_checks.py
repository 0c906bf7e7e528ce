"""Settings that are each valid alone but contradict one another across config sections.

A single section validates itself (``AlgorithmConfig.__post_init__``, ``PromptDataModule``'s
``__init__``, ...). What needs two sections at once is checked here, by the CLI, after the
classes are instantiated and before any weights load. Each problem names the keys involved and
what to change; all problems are reported together in one `ConfigError`.

What is covered:
- ``model.algorithm.ibpo`` other than ``none`` without a callback that makes corrections
  (``callbacks.CorrectionRollouts``): IBPO would silently train as plain GSPO.
- ``model.rollout.backend`` other than ``hf`` (a separate copy of the weights, as vLLM's)
  without a callback that syncs the weights to it (``callbacks.VLLMWeightSync``).
- ``model.rollout.num_mini_batches`` larger than the rows of a rollout batch
  (``data.prompts_per_step * model.rollout.group_size``): some mini-batches would be empty.
- No ``trainer.max_steps`` and no ``model.optim.total_steps``: the cosine schedule needs one.
- ``model.model`` a local path that is not a model directory (checked without loading it).
- ``--ckpt_path`` a file that does not exist or is not a readable checkpoint.

What is checked elsewhere: GSPO with an ``agg_mode`` (token-sum or any other aggregation) and a
group size below 2 (`ibpo_lit.config`); Lightning itself rejects ``trainer.gradient_clip_val``
and ``trainer.accumulate_grad_batches`` with manual optimization (use ``model.optim.grad_clip``
and ``model.rollout.micro_batch_size``).

What is not covered: whether ``data.max_prompt_tokens + rollout.sampling.max_new_tokens`` fits
the model's context (the model's config is not read before it loads).
"""
from __future__ import annotations

import os
from typing import Any, Optional

from ibpo_lit.errors import ConfigError, ModelNotFoundError

# Values of --ckpt_path that Lightning resolves itself rather than reading a file.
CKPT_KEYWORDS = ("last", "best", "hpc", "registry")


def ibpo_needs_corrections(ibpo: str, callbacks: list[Any]) -> Optional[str]:
    if ibpo == "none" or any(callable(getattr(cb, "on_rollouts_scored", None)) for cb in callbacks):
        return None
    return (
        f"model.algorithm.ibpo={ibpo!r} shapes rewards with correction rollouts, but no callback in "
        "trainer.callbacks makes them: add callbacks.CorrectionRollouts, or set model.algorithm.ibpo: none"
    )


def engine_needs_sync(backend: str, callbacks: list[Any]) -> Optional[str]:
    if backend == "hf" or any(callable(getattr(cb, "sync_engine", None)) for cb in callbacks):
        return None
    return (
        f"model.rollout.backend={backend!r} samples from a separate copy of the weights, but no callback in "
        "trainer.callbacks syncs them: add callbacks.VLLMWeightSync (without it every rollout would come "
        "from the initial weights)"
    )


def mini_batches_fit(num_mini_batches: int, prompts_per_step: int, group_size: int) -> Optional[str]:
    rows = prompts_per_step * group_size
    if num_mini_batches <= rows:
        return None
    return (
        f"model.rollout.num_mini_batches={num_mini_batches} exceeds the {rows} responses of a rollout batch "
        f"(data.prompts_per_step={prompts_per_step} x model.rollout.group_size={group_size}): lower it"
    )


def schedule_has_length(max_steps: int, total_steps: Optional[int]) -> Optional[str]:
    if total_steps is not None or max_steps > 0:
        return None
    return "set trainer.max_steps (or model.optim.total_steps): the cosine schedule needs the number of optimizer steps"


def model_path_exists(model: str) -> Optional[str]:
    from ibpo_lit.models.loading import check_model_path

    try:
        check_model_path(model)
    except ModelNotFoundError as e:
        return f"model.model: {e}"
    return None


def checkpoint_readable(ckpt_path: Optional[str]) -> Optional[str]:
    """Only existence here; `read_checkpoint_error` says whether a file that exists loads."""
    if not ckpt_path or ckpt_path in CKPT_KEYWORDS:
        return None
    if not os.path.exists(ckpt_path):
        return f"ckpt_path: no such checkpoint file: {ckpt_path}"
    if os.path.isdir(ckpt_path):
        return f"ckpt_path: {ckpt_path} is a directory; pass the checkpoint file (for example {ckpt_path}/last.ckpt)"
    return None


def read_checkpoint_error(ckpt_path: str, exc: BaseException) -> ConfigError:
    """The error for a checkpoint file that exists but does not load (truncated, not a checkpoint)."""
    return ConfigError(
        f"ckpt_path: {ckpt_path} is not a readable checkpoint ({type(exc).__name__}: {exc}); "
        "resume from an earlier checkpoint"
    )


def check_fit_settings(model: Any, datamodule: Any, trainer: Any, ckpt_path: Optional[str] = None) -> None:
    """Raise one `ConfigError` listing every cross-section contradiction (see the module docstring).

    ``model`` is an ``IBPOModule``, ``datamodule`` a ``PromptDataModule`` (or None), ``trainer``
    a Lightning ``Trainer``; none of them has loaded weights yet.
    """
    problems = [
        ibpo_needs_corrections(model.algorithm.ibpo, list(trainer.callbacks)),
        engine_needs_sync(getattr(model.rollout_cfg, "backend", "hf"), list(trainer.callbacks)),
        schedule_has_length(trainer.max_steps, model.optim_cfg.total_steps),
        model_path_exists(model.model_name),
        checkpoint_readable(ckpt_path),
    ]
    if datamodule is not None and hasattr(datamodule, "prompts_per_step"):
        problems.append(
            mini_batches_fit(model.rollout_cfg.num_mini_batches, datamodule.prompts_per_step, model.rollout_cfg.group_size)
        )
    problems = [p for p in problems if p]
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} settings to fix: " + "; ".join(problems))
