"""The shape README's "Layout" section describes: which room imports which, no import cycles
(imports inside functions included), and which names a room may branch on. Tests of shape, not
of size: a line count invites two-line wrappers; an arrow back up or a task's name compared in
the data room is what actually bends the house."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT = [p for root in ("ibpo_lit", "callbacks") for p in (REPO / root).rglob("*.py")]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PRODUCT}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` names in an import, at any depth (a function's too); ``from pkg
    import mod`` names ``pkg.mod`` when that is one of ours."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                names.add(child if child in MODULES else node.module)
    return names


GRAPH = {name: (_imports(path) & MODULES.keys()) - {name} for name, path in MODULES.items()}


def _room(module: str) -> str:
    """``ibpo_lit.data.datamodule`` -> ``data``; a top-level file is its own room; a
    subcommand's front end (``*cli``, ``__main__``) is the ``commands`` room."""
    parts = module.split(".")
    if parts[0] == "callbacks":
        return "callbacks"
    if parts[-1].endswith("cli") or parts[-1] in ("__main__", "trainer"):
        return "commands"
    return parts[1] if len(parts) > 1 else "ibpo_lit"


# Which rooms each room may import (besides itself): the arrows of docs/architecture.md, all
# pointing down. Leaves that import nothing of ours: registry, errors, fsync, file_lock,
# cache_dir, precision, config_keys.
BASE = {"registry", "errors", "fsync", "file_lock", "cache_dir", "precision"}
ALLOWED = {
    "algorithms": {"registry"},  # formulas: tensors in, tensors out
    "rewards": {"registry"},  # verifiers: strings in, scores out
    "tasks": {"registry", "rewards"},  # what a kind of problem is: its instruction, wording, verifier
    "scale": BASE,
    "models": BASE | {"scale"},
    "rollout": BASE | {"algorithms", "models", "scale"},  # engines know nothing of rewards or data
    "data": BASE | {"models", "rewards", "tasks"},
    "config": BASE | {"algorithms", "rollout", "tasks"},
    "plan": BASE | {"models", "scale", "rollout", "config"},
    "config_checks": BASE | {"models", "plan", "rollout", "scale", "config"},
    "model_rewards": BASE | {"models", "rewards", "rollout", "scale"},  # reward models and judges, in the trainer
    "training": BASE | {"algorithms", "config", "data", "models", "rollout", "scale", "tasks"},
    "tool_use": BASE | {"rewards", "rollout"},  # an engine and the sandboxed interpreter, joined
    "evaluation": BASE | {"config_checks", "data", "models", "rewards", "rollout", "tasks", "tool_use", "training"},
    "experiments": BASE | {"algorithms", "data", "evaluation", "rollout"},  # the exact-gradient testbed runs the formulas
    "module": BASE | {"algorithms", "config", "config_checks", "data", "evaluation", "model_rewards", "models",
                      "rewards", "rollout", "scale", "tasks", "tool_use", "training"},
    "callbacks": BASE | {"algorithms", "models", "rollout", "scale", "training"},  # never the module
    "help_cache": {"cache_dir"},
}


def test_no_import_cycles():
    """Imports inside functions count: hiding a cycle in a function does not remove it."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_every_arrow_points_down():
    wrong = sorted(
        f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
        if _room(a) in ALLOWED and _room(b) != _room(a) and _room(b) not in ALLOWED[_room(a)]
    )
    assert not wrong, "imports against docs/architecture.md's rooms:\n" + "\n".join(wrong)


def test_no_package_imports_its_own_init():
    """A module of a package never imports that package's ``__init__`` (the re-exports sit on top)."""
    packages = {n for n, p in MODULES.items() if p.name == "__init__.py"} - {"ibpo_lit"}  # its version only
    wrong = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                   if b in packages and a.startswith(b + ".") and MODULES[a].name != "__init__.py")
    assert not wrong, wrong


def test_callbacks_are_independent_and_never_import_the_module():
    wrong = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() if a.startswith("callbacks.")
                   for b in targets if b.startswith("callbacks") or b == "ibpo_lit.module")
    assert not wrong, wrong


def _compared_strings(path: Path) -> list[tuple[int, str]]:
    """String constants a comparison (``==``, ``!=``, ``in``) in ``path`` tests against."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            found += [(node.lineno, e.value) for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return found


def test_only_the_task_registry_branches_on_a_task_name():
    """Data, training, validation and evaluation ask the prompt's `Task`; none compares its name."""
    from ibpo_lit.tasks import TASKS

    names = set(TASKS.names())
    home = REPO / "ibpo_lit" / "tasks.py"
    wrong = [f"{p.relative_to(REPO)}:{line}: {value!r}" for p in PRODUCT if p != home
             for line, value in _compared_strings(p) if value in names]
    assert not wrong, wrong


@pytest.mark.parametrize("room", ["module", "evaluation", "training", "data", "callbacks"])
def test_steps_do_not_branch_on_an_engine_backend(room):
    """Training and evaluation build engines through one factory; the backend's name is compared
    only where engines and their settings live (rollout, config checks, the hardware plan)."""
    from ibpo_lit.rollout.factory import ENGINES

    names = set(ENGINES.names())
    wrong = [f"{p.relative_to(REPO)}:{line}: {value!r}" for p in PRODUCT if _room(_module_name(p)) == room
             for line, value in _compared_strings(p) if value in names]
    assert not wrong, wrong


def test_only_experiments_code_imports_the_experiment_bookkeeping():
    experiments = REPO / "ibpo_lit" / "experiments"
    offenders = {str(p.relative_to(REPO)): sorted(n for n in _imports(p) if n.startswith("ibpo_lit.experiments"))
                 for p in PRODUCT if experiments not in p.parents}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_product_imports_nothing_from_the_tests():
    offenders = {str(p.relative_to(REPO)): n for p in PRODUCT for n in _imports(p) if n.split(".")[0] in ("tests", "conftest")}
    assert not offenders
    assert not [p for p in PRODUCT if "testing" in p.stem], "test-only helpers belong in tests/"


def test_the_shape_tests_can_fail(tmp_path):
    """The checks above see what they claim to: a function-level import and a compared name."""
    code = "def f(task):\n    from ibpo_lit.module import IBPOModule\n    return task == 'code'\n"
    path = tmp_path / "probe.py"
    path.write_text(code)
    assert "ibpo_lit.module" in _imports(path)
    assert (3, "code") in _compared_strings(path)
    assert _room("ibpo_lit.plan.cli") == "commands" and _room("ibpo_lit.data.datamodule") == "data"
