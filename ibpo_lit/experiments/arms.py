"""Experiment arms: a base config plus the changes that make one arm of a comparison.

An arm is a named function from a base config (the dict of a ``configs/*.yaml``) to a new
config dict; ``build_arm_config`` adds what every arm of a compute-matched run shares: a
compute budget, gradient-variance logging, held-out validation and no per-step checkpoints.

Families (``ARM_FAMILIES``), after the IBPO and CIW papers' tables:
- baselines: GSPO with a 4x group against GSPO + IBPO (plain, ratio, mask) at the small group;
- ablations (IBPO's Table 3): ``k1`` (no counterfactual partner: the policy revises its wrong
  answer alone) and ``shaping_only`` (corrections shape rewards but are not trained);
- ``lambda_*`` (Table 4) and ``alpha_*`` (Table 5): IBPO plain with one setting changed;
  ``lambda_0`` (not in the paper's table) keeps the corrections and trains on them but shapes
  nothing: against ``lambda_0.6`` only the shaping differs (results/lambda_shaping/PROTOCOL.md);
- CIW (METHOD section 8): DAPO and GSPO with and without CIW, IBPO-mask + CIW, inverted weights.
Every arm but ``gspo_large_group`` runs at the small group. ``lambda_0.6`` and ``alpha_0.6``
set the paper's values explicitly, so they equal ``ibpo_plain`` on a base that already has
them (the shipped configs do); they exist so that a sweep is one ``--arms`` list.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

CORRECTION = "callbacks.CorrectionRollouts"


@dataclass(frozen=True)
class ArmSettings:
    small_group: int = 8  # G of the IBPO arms; GSPO's large group is 4x this
    budget_flops: float | None = None
    budget_device_seconds: float | None = None
    val_size: int = 16
    val_every: int = 4  # rollout steps between validations
    val_samples: int = 2
    grad_var_every: int = 2  # 0: no gradient-variance logger (its extra backward passes cost wall time)
    grad_var_filter: str = r"layers\.(0|15|29)\."
    # Step-matched runs: every arm stops after this many steps and keeps the base config's
    # learning-rate schedule (the budget, if any, still stops a run early). None: the budget ends
    # the run and the learning rate is constant (arms take different numbers of steps).
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"ArmSettings.max_steps must be >= 1 or None, got {self.max_steps}")
        if self.grad_var_every < 0:
            raise ValueError(f"ArmSettings.grad_var_every must be >= 0 (0: off), got {self.grad_var_every}")


def _callbacks(cfg: dict) -> list:
    return cfg.setdefault("trainer", {}).setdefault("callbacks", [])


def _without_corrections(cfg: dict) -> dict:
    cfg["trainer"]["callbacks"] = [cb for cb in _callbacks(cfg) if cb.get("class_path") != CORRECTION]
    cfg["trainer"]["callbacks"] = [cb for cb in cfg["trainer"]["callbacks"] if cb.get("class_path") != "callbacks.CorrectionMetrics"]
    return cfg


def _with_corrections(cfg: dict) -> dict:
    if not any(cb.get("class_path") == CORRECTION for cb in _callbacks(cfg)):
        _callbacks(cfg).append({"class_path": CORRECTION})
    if not any(cb.get("class_path") == "callbacks.CorrectionMetrics" for cb in _callbacks(cfg)):
        _callbacks(cfg).append({"class_path": "callbacks.CorrectionMetrics"})
    return cfg


def _set(cfg: dict, dotted: str, value) -> None:
    node = cfg
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def gspo_large(cfg: dict, s: ArmSettings) -> dict:
    """GSPO alone with a group 4x larger (the paper's G = 64 against IBPO's G = 8)."""
    _set(cfg, "model.algorithm.ibpo.variant", "none")
    _set(cfg, "model.rollout.group_size", 4 * s.small_group)
    return _without_corrections(cfg)


def _ibpo(variant: str) -> Callable[[dict, ArmSettings], dict]:
    def arm(cfg: dict, s: ArmSettings) -> dict:
        _set(cfg, "model.algorithm.ibpo.variant", variant)
        _set(cfg, "model.rollout.group_size", s.small_group)
        return _with_corrections(cfg)

    arm.__doc__ = f"GSPO + IBPO ({variant}) with the small group."
    return arm


def _ibpo_plain_with(*, ibpo: dict, doc: str) -> Callable[[dict, ArmSettings], dict]:
    """IBPO plain at the small group with some ``model.algorithm.ibpo`` fields changed."""

    def arm(cfg: dict, s: ArmSettings) -> dict:
        cfg = _ibpo("plain")(cfg, s)
        for key, value in ibpo.items():
            _set(cfg, f"model.algorithm.ibpo.{key}", value)
        return cfg

    arm.__doc__ = doc
    return arm


def _dapo(cfg: dict) -> dict:
    """GRPO's token-level ratio with DAPO's token-mean aggregation and clip-higher."""
    _set(cfg, "model.algorithm.loss", "grpo")
    _set(cfg, "model.algorithm.agg_mode", "token-mean")
    _set(cfg, "model.algorithm.eps_low", 0.2)
    _set(cfg, "model.algorithm.eps_high", 0.28)
    return cfg


def _ciw_arm(base: str, mode: str | None) -> Callable[[dict, ArmSettings], dict]:
    """CIW's comparison (METHOD section 8): ``base`` (``dapo``, ``gspo`` or ``ibpo_mask``),
    with CIW in ``mode`` (``ciw`` or an ablation) or without it (None), all at the small group."""

    def arm(cfg: dict, s: ArmSettings) -> dict:
        _set(cfg, "model.rollout.group_size", s.small_group)
        if base == "ibpo_mask":
            _set(cfg, "model.algorithm.ibpo.variant", "mask")
            _with_corrections(cfg)
        else:
            _set(cfg, "model.algorithm.ibpo.variant", "none")
            _without_corrections(cfg)
            if base == "dapo":
                _dapo(cfg)
        if mode is not None:
            _set(cfg, "model.algorithm.ciw", {"mode": mode})
        return cfg

    arm.__doc__ = f"{base} {'+ CIW (' + mode + ')' if mode else 'without CIW'}, small group."
    return arm


# lambda * beta = 0.5 * lambda stays < 1 (METHOD section 5). 0 (arm ``lambda_0``): corrections are
# still made and trained on (the corrector and the correction samples' advantages never read
# lambda), their Delta is computed and multiplied by 0, so only the shaping is switched off.
LAMBDAS = (0, 0.2, 0.4, 0.6, 0.8, 1.0)
ALPHAS = (0.5, 0.6, 0.7, "adaptive")

ARM_FAMILIES: dict[str, dict[str, Callable[[dict, ArmSettings], dict]]] = {
    "baselines": {
        "gspo_large_group": gspo_large,
        "ibpo_plain": _ibpo("plain"),
        "ibpo_ratio": _ibpo("ratio"),
        "ibpo_mask": _ibpo("mask"),
    },
    "ablations": {
        "k1": _ibpo_plain_with(
            ibpo={"reference": "none"},
            doc="IBPO plain, k = 1: each wrong rollout is revised alone, with no reference.",
        ),
        "shaping_only": _ibpo_plain_with(
            ibpo={"train_on_corrections": False},
            doc="IBPO plain whose corrections shape rewards but are not trained.",
        ),
    },
    "lambda": {
        f"lambda_{lam}": _ibpo_plain_with(ibpo={"lam": lam}, doc=f"IBPO plain with lambda = {lam}.")
        for lam in LAMBDAS
    },
    "alpha": {
        f"alpha_{alpha}": _ibpo_plain_with(ibpo={"alpha": alpha}, doc=f"IBPO plain with alpha = {alpha}.")
        for alpha in ALPHAS
    },
    # CIW's arms (issue: DAPO vs DAPO+CIW, GSPO vs GSPO+CIW, IBPO-mask+CIW; inverted ablation)
    "ciw": {
        "dapo": _ciw_arm("dapo", None),
        "dapo_ciw": _ciw_arm("dapo", "ciw"),
        "gspo": _ciw_arm("gspo", None),
        "gspo_ciw": _ciw_arm("gspo", "ciw"),
        "ibpo_mask_ciw": _ciw_arm("ibpo_mask", "ciw"),
        "gspo_ciw_inverted": _ciw_arm("gspo", "inverted"),
    },
}
ARMS: dict[str, Callable[[dict, ArmSettings], dict]] = {
    name: arm for family in ARM_FAMILIES.values() for name, arm in family.items()
}


def build_arm_config(base: dict, arm: str, seed: int, settings: ArmSettings, root_dir: str) -> dict:
    """The full config of one run: ``arm`` applied to ``base``, for ``seed``, writing under
    ``root_dir``. The seed is ``seed_everything`` and the rollout seed: sampling, the order of the
    training problems (the arithmetic stream and a file's shuffle follow ``seed_everything``
    unless the base pins ``data.arithmetic.seed`` / ``data.seed``) and a model built in code. So
    every arm at one seed sees the same problem stream and seeds differ in it; the held-out
    problems (validation, ``--final-eval``) are the same for every seed (`data.arithmetic.held_out`)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; valid: {', '.join(sorted(ARMS))}")
    cfg = ARMS[arm](copy.deepcopy(base), settings)
    cfg["seed_everything"] = seed
    _set(cfg, "model.rollout.seed", seed)
    trainer = cfg["trainer"]
    trainer.update(
        {
            "default_root_dir": root_dir,
            "max_steps": settings.max_steps or 100_000,  # unset: the compute budget ends the run
            "enable_progress_bar": False,
            "val_check_interval": settings.val_every,
            "check_val_every_n_epoch": None,
            "num_sanity_val_steps": 0,
        }
    )
    if settings.max_steps is None:
        # Arms take different numbers of steps for the same compute, so no schedule can be the
        # same for all: a constant learning rate keeps them comparable.
        _set(cfg, "model.optim.warmup_ratio", 0.0)
        _set(cfg, "model.optim.min_lr_ratio", 1.0)
    budget = {}
    if settings.budget_flops is not None:
        budget["max_flops"] = settings.budget_flops
    if settings.budget_device_seconds is not None:
        budget["max_device_seconds"] = settings.budget_device_seconds
    if not budget and settings.max_steps is None:
        raise ValueError("a comparison needs a budget (flops or device seconds) or max_steps")
    callbacks = [cb for cb in _callbacks(cfg) if cb.get("class_path") not in (
        "callbacks.ComputeBudgetStopper", "callbacks.GradientVarianceLogger")]
    callbacks.append({"class_path": "callbacks.ComputeBudgetStopper", "init_args": budget})  # logs compute too
    if settings.grad_var_every:
        callbacks.append(
            {
                "class_path": "callbacks.GradientVarianceLogger",
                "init_args": {"every_n_steps": settings.grad_var_every, "num_splits": 4,
                              "param_filter": settings.grad_var_filter, "seed": seed},
            }
        )
    trainer["callbacks"] = callbacks
    if "logger" in trainer:
        trainer["logger"] = with_tensorboard(trainer["logger"], root_dir)
    cfg["checkpoint"] = {"save_last": False, "save_top_k": 0}
    _set(cfg, "data.val_size", settings.val_size)
    _set(cfg, "model.val_samples", settings.val_samples)
    return cfg


TENSORBOARD = "lightning.pytorch.loggers.TensorBoardLogger"


def with_tensorboard(logger, save_dir: str):
    """``trainer.logger`` with a TensorBoard logger among its loggers: run summaries are read from
    its event files (`runs.read_scalars`). The user's W&B or MLflow logger stays and gets every
    metric too. Unset or ``true`` is Lightning's default, TensorBoard already."""
    if logger is None or logger is True:
        return logger
    loggers = [] if logger is False else list(logger) if isinstance(logger, list) else [logger]
    if any(isinstance(entry, dict) and entry.get("class_path", "").endswith("TensorBoardLogger") for entry in loggers):
        return loggers
    # `save_dir`: the run's default_root_dir, where Lightning's default logger writes its events.
    return [*loggers, {"class_path": TENSORBOARD, "init_args": {"save_dir": save_dir}}]


def same_config_arm(base: dict, arm: str, seed: int, settings: ArmSettings, candidates) -> str | None:
    """The first of ``candidates`` whose run of ``seed`` is exactly ``arm``'s run (same config
    once the run folder is set aside), else None.

    Sweeps name the paper's own setting as an arm (``lambda_0.6``, ``alpha_0.6``), which on a
    base that already has it is ``ibpo_plain`` again: training it twice would spend the budget
    on a run the comparison already has, so ``compare.py`` records the twin's result instead.
    """
    mine = build_arm_config(base, arm, seed, settings, root_dir="")
    for other in candidates:
        if other != arm and build_arm_config(base, other, seed, settings, root_dir="") == mine:
            return other
    return None
