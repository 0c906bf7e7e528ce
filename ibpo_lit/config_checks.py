"""Settings that are each valid alone but contradict one another across config sections.

A single section validates itself (``AlgorithmConfig.__post_init__``, ``PromptDataModule``'s
``__init__``, ...). What needs two sections at once is checked here, once per ``fit``: by the
command line right after it builds the classes, or by ``IBPOModule.setup`` for a ``Trainer.fit``
in Python; either way before any weights load. Each problem names the keys involved and what to change; all problems are reported
together in one `ConfigError`.

What is covered:
- ``model.algorithm.ibpo`` other than ``none`` without a callback that makes corrections
  (``callbacks.CorrectionRollouts``): IBPO would silently train as plain GSPO.
- ``model.rollout.backend`` whose engine holds a separate copy of the weights (vLLM's:
  ``EngineBackend.separate_weights``) without a callback that syncs the weights to it
  (``callbacks.VLLMWeightSync``).
- ``model.rollout.backend: vllm`` where ``import vllm`` fails (not installed, or a broken install).
- ``model.rollout.num_mini_batches`` larger than the rows of a rollout batch
  (``data.prompts_per_step * model.rollout.group_size``): some mini-batches would be empty.
- No ``trainer.max_steps`` and no ``model.optim.total_steps``: the cosine schedule needs one.
- ``model.model`` a local path that is not a model directory (checked without loading it).
- ``--ckpt_path`` a path that does not exist, or a folder that is not a sharded checkpoint.
- ``trainer.strategy`` Lightning's ``FSDPStrategy`` (FSDP1, which cannot run the module's manual
  backward passes) or DeepSpeed: use ``ibpo_lit.scale.FSDP2Strategy``. The command line checks the
  name before Lightning builds the strategy (which for FSDP1 on a CPU fails with its own error).
- bf16 asked for (``trainer.precision``, ``model.dtype``, ``model.rollout.vllm.dtype``) on a CPU
  that emulates it: a warning, not an error (`ibpo_lit.precision`).
- ``model.lora`` under ``FSDP2Strategy`` (not supported yet).
- a callback that measures one process only (``callbacks.GradientVarianceLogger``) in a run of
  several processes: it would log one rank's share as if it were the batch's.
- ``model.rollout.vllm.tensor_parallel_size`` that does not divide the processes of the run
  (``trainer.devices x trainer.num_nodes``): each vLLM engine spans consecutive ranks.
- ``data.max_prompt_tokens + model.rollout.sampling.max_new_tokens`` longer than the model's
  context (its config's ``max_position_embeddings``, read without loading weights when it is
  on disk) or than ``model.rollout.vllm.max_model_len``.

- ``model.rollout.max_staleness: 1`` (one step off-policy, `ibpo_lit.training.off_policy`) without
  what it needs: ``backend: vllm_server``, rollout correction on, one process, no dynamic
  sampling, ``VLLMWeightSync.every_n_steps: 1``, and a data module
  that hands the next step's prompts (``data.steps_ahead``, linked on the command line). On a CPU
  without ``OMP_WAIT_POLICY=PASSIVE`` in the environment it warns (`off_policy_spin_warning`).

- The run's plan (`ibpo_lit.plan`, ``plan:`` settings): memory per GPU by phase, the KV cache,
  the collective timeout (on a GPU), and how much of each candidate a correction prompt keeps.

What is checked elsewhere: GSPO with an ``agg_mode`` (token-sum or any other aggregation) and a
group size below 2 (`ibpo_lit.config`); Lightning itself rejects ``trainer.gradient_clip_val``
and ``trainer.accumulate_grad_batches`` with manual optimization (use ``model.optim.grad_clip``
and ``model.rollout.micro_batch_size``).

What is not covered: the context of a hub model that is not in the local Hugging Face cache
(no download happens at config time); such a run checks nothing here and relies on vLLM's
and transformers' own errors.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional

from ibpo_lit.errors import ConfigError, ModelNotFoundError

# Values of --ckpt_path that Lightning resolves itself rather than reading a file.
CKPT_KEYWORDS = ("last", "best", "hpc", "registry")


def ibpo_needs_corrections(variant: str, callbacks: list[Any]) -> Optional[str]:
    if variant == "none" or any(callable(getattr(cb, "on_rollouts_scored", None)) for cb in callbacks):
        return None
    return (
        f"model.algorithm.ibpo.variant={variant!r} shapes rewards with correction rollouts, but no callback in "
        "trainer.callbacks makes them: add callbacks.CorrectionRollouts, or set model.algorithm.ibpo.variant: none"
    )


def engine_needs_sync(backend: str, callbacks: list[Any]) -> Optional[str]:
    from ibpo_lit.rollout.factory import ENGINES  # (imports no engine: each is imported when built)

    if not ENGINES.get(backend).separate_weights:
        return None
    if any(callable(getattr(cb, "sync_engine", None)) for cb in callbacks):
        return None
    return (
        f"model.rollout.backend={backend!r} samples from a separate copy of the weights, but no callback in "
        "trainer.callbacks syncs them: add callbacks.VLLMWeightSync (without it every rollout would come "
        "from the initial weights)"
    )


def vllm_installed(backend: str, setting: str = "model.rollout.backend: vllm") -> Optional[str]:
    """vLLM is imported only when the engine is built, after the weights load: check it first."""
    if backend != "vllm":
        return None
    from ibpo_lit.rollout.vllm_engine import vllm_import_error, vllm_install_hint

    error = vllm_import_error()
    return None if error is None else f"{vllm_install_hint(setting)} ({error})"


def single_process_callbacks_fit(callbacks: list[Any], processes: int) -> Optional[str]:
    """Callbacks that measure one process's share only (``requires_single_process = True``)."""
    names = [type(cb).__name__ for cb in callbacks if getattr(cb, "requires_single_process", False)]
    if processes <= 1 or not names:
        return None
    return (
        f"trainer.callbacks: {', '.join(names)} measures one process's rows and gradients only, and this run has "
        f"{processes} processes: remove it (scripts/variance_at_fixed_policy.py measures the gradient variance "
        "of every method at fixed weights on one process)"
    )


def off_policy_fits(max_staleness: int, backend: str, correction_on: bool, processes: Optional[int],
                    dynamic_sampling: bool, callbacks: list[Any],
                    steps_ahead: Optional[int], model_rewards: tuple[str, ...] = ()) -> Optional[str]:
    """One step off-policy generation's requirements (`ibpo_lit.training.off_policy` says why)."""
    if steps_ahead is not None and steps_ahead != max_staleness:
        return (f"data.steps_ahead={steps_ahead} but model.rollout.max_staleness={max_staleness}: the data module must "
                "hand the next step's prompts exactly when the engine samples ahead; set them equal (the command "
                "line links them)")
    if not max_staleness:
        return None
    needs = []
    if backend != "vllm_server":
        needs.append(f"model.rollout.backend: vllm_server (got {backend!r}: the engine must run in its own processes, "
                     "apart from the update's weights and memory)")
    if not correction_on:
        needs.append("model.rollout_correction on (its importance weights correct for the lagging engine; it is off "
                     "with enabled: false, rollout.old_logp: rollout, or rollout_is and rollout_rs both null)")
    if processes is not None and processes > 1 and model_rewards:
        needs.append(f"no reward scored by a model in the trainer ({', '.join(model_rewards)}) with {processes} "
                     "processes (its sharded forwards would run on the update's process group at the same time)")
    if dynamic_sampling:
        needs.append("model.algorithm.dynamic_sampling off (its rounds decide after scoring whether to sample again)")
    lagging = [cb.every_n_steps for cb in callbacks if callable(getattr(cb, "sync_engine", None))
               and getattr(cb, "every_n_steps", 1) != 1]
    if lagging:
        needs.append(f"callbacks.VLLMWeightSync.every_n_steps: 1 (got {lagging[0]}: the engine would lag more)")
    if not needs:
        return None
    return f"model.rollout.max_staleness={max_staleness} (one step off-policy) needs " + "; ".join(needs)


def off_policy_spin_warning(max_staleness: int, on_cpu: bool, environ: Mapping[str, str]) -> Optional[str]:
    """A warning when one step off-policy runs on a CPU whose OpenMP threads spin when idle.

    The engine's server and the trainer then share the cores, and each one's OpenMP threads spin
    after every parallel region while the other wants the core. Measured on 2 cores
    (docs/benchmarks.md, "One step off-policy on the CPU"): the off-policy step took 2.15x the
    synchronous one with the default, 1.05x with ``OMP_WAIT_POLICY=PASSIVE``. A warning, not a
    setting: OpenMP reads the variable once, when torch loads it, so it must be set before the
    process (and the server's) starts."""
    if not max_staleness or not on_cpu or environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        return None
    return (f"model.rollout.max_staleness={max_staleness} on a CPU with OMP_WAIT_POLICY="
            f"{environ.get('OMP_WAIT_POLICY') or 'unset'}: the server's and the trainer's OpenMP threads spin on the "
            "cores they share (measured on 2 cores: each step 2-3x as long as synchronously); start both with "
            "OMP_WAIT_POLICY=PASSIVE in their environment, or use max_staleness: 0 on a CPU")


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
    """Only existence here; `read_checkpoint_error` says whether a file that exists loads. A
    folder is accepted when it is a sharded checkpoint (FSDP2's distributed format)."""
    if not ckpt_path or ckpt_path in CKPT_KEYWORDS:
        return None
    if not os.path.exists(ckpt_path):
        return f"ckpt_path: no such checkpoint: {ckpt_path}"
    if os.path.isdir(ckpt_path) and not is_sharded_checkpoint(ckpt_path):
        return (
            f"ckpt_path: {ckpt_path} is a folder but not a sharded checkpoint (no .metadata and meta.pt); "
            f"pass a checkpoint (for example {ckpt_path}/last.ckpt)"
        )
    return None


def is_sharded_checkpoint(path: str) -> bool:
    """A folder written by a sharded save (torch.distributed.checkpoint plus Lightning's meta.pt)."""
    return os.path.isfile(os.path.join(path, ".metadata")) and os.path.isfile(os.path.join(path, "meta.pt"))


# Lightning's registry names (and class names) of the strategies ibpo-lit refuses.
FSDP1_NAMES = ("fsdp", "fsdp_cpu_offload", "fsdpstrategy")


def strategy_supported(strategy: Any) -> Optional[str]:
    """``strategy``: a Strategy, or what the config says (a registry name such as ``fsdp``, or a
    class path): checked before Lightning builds it, which for FSDP1 on a CPU already fails."""
    name = strategy if isinstance(strategy, str) else type(strategy).__name__
    short = name.rsplit(".", 1)[-1].lower()
    if short in FSDP1_NAMES:
        return (
            f"trainer.strategy: {name} is Lightning's FSDPStrategy (FSDP1), which runs training_step inside the root "
            "module's forward, where ibpo-lit's manual backward passes and its callbacks' forwards cannot run; use "
            "trainer.strategy: fsdp2 (ibpo_lit.scale.FSDP2Strategy: the same sharding, applied per decoder layer)"
        )
    if "deepspeed" in short:
        return (f"trainer.strategy: {name} (DeepSpeed) is not supported (its engine owns the optimizer step ibpo-lit "
                "takes itself); use trainer.strategy: fsdp2 (sharded) or ddp")
    return None


def strategy_config_problem(name: Any, init_args: Any = None) -> Optional[str]:
    """`strategy_supported` on ``trainer.strategy`` as the config gives it (a name or class
    path, and its ``init_args``), and FSDP2's refused ``cpu_offload``: checked before Lightning
    builds the strategy, whose own errors would come as a traceback."""
    if not isinstance(name, str):
        return None
    problem = strategy_supported(name)
    if problem is None and name.rsplit(".", 1)[-1] in ("FSDP2Strategy", "fsdp2") and getattr(init_args, "cpu_offload", False):
        from ibpo_lit.scale.strategy import CPU_OFFLOAD_UNSUPPORTED

        problem = CPU_OFFLOAD_UNSUPPORTED
    return problem


def lora_fits(lora: Any, strategy: Any) -> Optional[str]:
    if lora is None or type(strategy).__name__ != "FSDP2Strategy":
        return None
    return ("model.lora with ibpo_lit.scale.FSDP2Strategy is not supported (the adapters' merge for the engine "
            "and the adapter-only checkpoint assume whole weights): use ddp, or full fine-tuning under FSDP2")


def tensor_parallel_fits(backend: str, tensor_parallel_size: int, processes: int) -> Optional[str]:
    if backend != "vllm":
        return None
    from ibpo_lit.rollout.vllm_engine import tensor_parallel_problem  # (no vLLM import: its module imports it lazily)

    return tensor_parallel_problem(tensor_parallel_size, processes)


def context_fits(model_name: str, prompt_tokens: int, new_tokens: int, max_model_len: Optional[int]) -> Optional[str]:
    from ibpo_lit.models.loading import model_context_length

    need = prompt_tokens + new_tokens
    problems = []
    context = model_context_length(model_name)
    if context is not None and need > context:
        problems.append(f"the model's context of {context} tokens (max_position_embeddings)")
    if max_model_len is not None and need > max_model_len:
        problems.append(f"model.rollout.vllm.max_model_len={max_model_len}")
    if not problems:
        return None
    return (
        f"data.max_prompt_tokens={prompt_tokens} + model.rollout.sampling.max_new_tokens={new_tokens} = {need} "
        f"exceeds {' and '.join(problems)}: lower one of them"
    )


def plan_problems(model: Any, datamodule: Any, trainer: Any, settings: Any = None) -> list[str]:
    """What the run's plan (`ibpo_lit.plan`) refuses: on a GPU, a phase that does not fit its
    memory, a KV cache that holds no sequence, a collective timeout shorter than the waits; on
    any device, correction prompts that keep too little of their candidates. With
    ``plan.check: false`` they are warnings. Nothing when the model's config cannot be read
    offline (as for the context check)."""
    from ibpo_lit.models.loading import model_config
    from ibpo_lit.plan.plan import PlanSettings, build_plan
    from ibpo_lit.plan.run import RunShape
    from ibpo_lit.plan.shapes import ModelShape

    settings = settings if settings is not None else PlanSettings()
    config = model_config(model.model_name)
    if config is None or datamodule is None or not hasattr(datamodule, "prompts_per_step"):
        return []
    shape = ModelShape.from_config(config, getattr(model, "attn_implementation", None))
    problems = build_plan(shape, RunShape.from_fit(model, datamodule, trainer), settings).problems()
    if problems and not settings.check:
        from lightning.pytorch.utilities import rank_zero_warn

        for problem in problems:
            rank_zero_warn(f"{problem} (plan.check: false, so the run goes on)")
        return []
    if problems:
        problems[-1] += " (`python -m ibpo_lit plan --config ...` prints the whole plan; plan.check: false runs anyway)"
    return problems


def _warn_slow_precision(model: Any, trainer: Any) -> None:
    from ibpo_lit.precision import slow_bf16_settings

    rollout = model.rollout_cfg
    dtypes = {"model.dtype": model.dtype_name}
    if rollout.backend == "vllm":
        dtypes["model.rollout.vllm.dtype"] = rollout.vllm.dtype
    warning = slow_bf16_settings(getattr(trainer, "precision", None), getattr(trainer, "accelerator", "auto"), dtypes)
    if warning:
        from lightning.pytorch.utilities import rank_zero_warn

        rank_zero_warn(warning)


def _warn_off_policy_spin(model: Any, trainer: Any) -> None:
    from ibpo_lit.precision import runs_on_cpu

    warning = off_policy_spin_warning(getattr(model.rollout_cfg, "max_staleness", 0),
                                      runs_on_cpu(getattr(trainer, "accelerator", "auto")), os.environ)
    if warning:
        from lightning.pytorch.utilities import rank_zero_warn

        rank_zero_warn(warning)


def read_checkpoint_error(ckpt_path: str, exc: BaseException) -> ConfigError:
    """The error for a checkpoint file that exists but does not load (truncated, not a checkpoint)."""
    return ConfigError(
        f"ckpt_path: {ckpt_path} is not a readable checkpoint ({type(exc).__name__}: {exc}); "
        "resume from an earlier checkpoint"
    )


def _off_policy_problem(model: Any, datamodule: Any, trainer: Any, processes: Optional[int]) -> Optional[str]:
    rollout = model.rollout_cfg
    return off_policy_fits(
        getattr(rollout, "max_staleness", 0), rollout.backend, model.updater.correction is not None, processes,
        model.group_filter is not None, list(trainer.callbacks),
        getattr(datamodule, "steps_ahead", None) if datamodule is not None else None,
        tuple(getattr(model, "model_scored_rewards", ())))


def _processes(trainer: Any) -> Optional[int]:
    try:
        return int(trainer.num_devices) * int(trainer.num_nodes)
    except (AttributeError, TypeError, ValueError):
        return None


def check_fit_settings(model: Any, datamodule: Any, trainer: Any, ckpt_path: Optional[str] = None,
                       plan_settings: Any = None) -> None:
    """Raise one `ConfigError` listing every cross-section contradiction (see the module docstring).

    ``model`` is an ``IBPOModule``, ``datamodule`` a ``PromptDataModule`` (or None), ``trainer``
    a Lightning ``Trainer``; none of them has loaded weights yet. ``plan_settings``: the config's
    ``plan`` section (`ibpo_lit.plan.plan.PlanSettings`; None: its defaults).
    """
    path_problem = model_path_exists(model.model_name)
    problems = [
        path_problem,
        ibpo_needs_corrections(model.algorithm.ibpo.variant, list(trainer.callbacks)),
        engine_needs_sync(getattr(model.rollout_cfg, "backend", "hf"), list(trainer.callbacks)),
        vllm_installed(getattr(model.rollout_cfg, "backend", "hf")),
        schedule_has_length(trainer.max_steps, model.optim_cfg.total_steps),
        checkpoint_readable(ckpt_path),
        strategy_supported(getattr(trainer, "strategy", None)),
        lora_fits(getattr(model, "lora", None), getattr(trainer, "strategy", None)),
    ]
    rollout = model.rollout_cfg
    processes = _processes(trainer)
    if processes is not None:
        problems.append(tensor_parallel_fits(rollout.backend, rollout.vllm.tensor_parallel_size, processes))
        problems.append(single_process_callbacks_fit(list(trainer.callbacks), processes))
    problems.append(_off_policy_problem(model, datamodule, trainer, processes))
    if datamodule is not None and hasattr(datamodule, "prompts_per_step"):
        problems.append(
            mini_batches_fit(rollout.num_mini_batches, datamodule.prompts_per_step, rollout.group_size)
        )
    if datamodule is not None and hasattr(datamodule, "max_prompt_tokens") and path_problem is None:
        max_model_len = rollout.vllm.max_model_len if rollout.backend == "vllm" else None
        problems.append(
            context_fits(model.model_name, datamodule.max_prompt_tokens, rollout.sampling.max_new_tokens, max_model_len)
        )
    if not any(problems):  # a plan of a contradictory config would only repeat its problems
        problems.extend(plan_problems(model, datamodule, trainer, plan_settings))
    _warn_slow_precision(model, trainer)
    _warn_off_policy_spin(model, trainer)
    problems = [p for p in problems if p]
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} settings to fix: " + "; ".join(problems))
