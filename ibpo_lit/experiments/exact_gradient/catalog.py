"""The methods the testbed compares, by name, and the sweeps' axes.

Every IBPO method uses the paper's settings unless its name says otherwise: lambda 0.6,
beta 0.5, alpha 0.6, k = 1 correction per wrong rollout, partner from the group, joint
training on corrections grouped by prompt, GSPO loss; the corrector is the sweep's, by default
``DEFAULT_CORRECTOR``: informative, skill 0.75, locality 0.1 (about 2/3 of the corrections right at
the initial policy, the policy redrawing a quarter of the fixable errors and a tenth of the rest,
so that the correction samples' log-probs depend on it). A sweep moves one of its settings and
keeps the others at the default.
"""
from __future__ import annotations

from dataclasses import replace

from ibpo_lit.algorithms.ciw import CIWConfig
from ibpo_lit.experiments.exact_gradient.corrector import CorrectorSpec
from ibpo_lit.experiments.exact_gradient.estimators import Method

DEFAULT_CORRECTOR = CorrectorSpec("informative", skill=0.75, locality=0.1)
SELF_REVISION = CorrectorSpec("uninformative", skill=0.5)  # no partner: redraw half the tokens


def main_methods(group_size: int = 8, corrector: CorrectorSpec = DEFAULT_CORRECTOR) -> list[Method]:
    """The first table's methods (a GSPO with more rollouts is added at matched cost)."""
    g = {"group_size": group_size}
    ibpo = {**g, "corrector": corrector}
    return [
        Method("gspo", **g),
        Method("grpo", loss="grpo", **g),
        Method("gspo_noscale", advantage_scale="none", **g),
        Method("gspo_ciw", ciw=CIWConfig(), **g),
        Method("ibpo_plain", variant="plain", **ibpo),
        Method("ibpo_ratio", variant="ratio", **ibpo),
        Method("ibpo_mask", variant="mask", **ibpo),
        Method("ibpo_shaping_only", variant="plain", train_on_corrections=False, **ibpo),
        Method("ibpo_shaping_only_noscale", variant="plain", train_on_corrections=False, advantage_scale="none", **ibpo),
        Method("ibpo_corrections_only", variant="plain", lam=0.0, **ibpo),
        Method("ibpo_k1", variant="plain", reference="none", corrector=SELF_REVISION, **g),
        Method("ibpo_uninformative", variant="plain", corrector=SELF_REVISION, **g),
    ]


def matched_gspo(group_size: int) -> Method:
    return Method(f"gspo_G{group_size}", group_size=group_size)


SWEEP_METHODS = ("ibpo_plain", "ibpo_shaping_only", "ibpo_shaping_only_noscale", "ibpo_mask")


def sweep_methods(group_size: int, corrector: CorrectorSpec, **ibpo_changes) -> list[Method]:
    """GSPO at the same G (the paired baseline) and the IBPO methods of a sweep point."""
    by_name = {m.name: m for m in main_methods(group_size, corrector)}
    return [by_name["gspo"]] + [replace(by_name[name], **ibpo_changes) for name in SWEEP_METHODS]


# axis -> values; "corrector" axes change the CorrectorSpec, the others the Method or Problem
SWEEPS = {
    "lam": [0.2, 0.6, 1.0, 1.4, 1.9],
    "skill_informative": [0.0, 0.25, 0.5, 0.75, 1.0],
    "skill_uninformative": [0.25, 0.5, 0.75, 1.0],
    "locality": [0.0, 0.2, 0.5, 1.0],
    "alpha": [0.3, 0.6, 1.0, "adaptive"],
    "group_size": [4, 8, 16, 32],
    "length": [6, 8, 10],
}


def sweep_point(axis: str, value, group_size: int = 8) -> tuple[list[Method], dict]:
    """``(methods, problem_changes)`` of one sweep point."""
    corrector = DEFAULT_CORRECTOR
    changes, problem = {}, {}
    if axis == "lam":
        changes["lam"] = value
    elif axis == "skill_informative":
        corrector = CorrectorSpec("informative", skill=value, locality=DEFAULT_CORRECTOR.locality)
    elif axis == "skill_uninformative":
        corrector = CorrectorSpec("uninformative", skill=value)
    elif axis == "locality":
        corrector = CorrectorSpec("informative", skill=DEFAULT_CORRECTOR.skill, locality=value)
    elif axis == "alpha":
        changes["alpha"] = value
    elif axis == "group_size":
        group_size = value
    elif axis == "length":
        problem["length"] = value
    else:
        raise ValueError(f"unknown sweep axis {axis!r}; known: {', '.join(SWEEPS)}")
    return sweep_methods(group_size, corrector, **changes), problem
