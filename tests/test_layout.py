"""The package layout README's "Layout" section describes (issue 18): the experiment bookkeeping
stays apart from training, test helpers stay in the tests, and the training step stays a
sequence of hand-offs."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRODUCT = [p for root in ("ibpo_lit", "callbacks") for p in (REPO / root).rglob("*.py")]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_experiments_code_imports_the_experiment_bookkeeping():
    experiments = REPO / "ibpo_lit" / "experiments"
    offenders = {str(p.relative_to(REPO)): sorted(n for n in _imports(p) if n.startswith("ibpo_lit.experiments"))
                 for p in PRODUCT if experiments not in p.parents}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_product_imports_nothing_from_the_tests():
    offenders = {str(p.relative_to(REPO)): n for p in PRODUCT for n in _imports(p) if n.split(".")[0] in ("tests", "conftest")}
    assert not offenders
    assert not [p for p in PRODUCT if "testing" in p.stem], "test-only helpers belong in tests/"


def test_training_step_is_a_short_sequence_of_hand_offs():
    tree = ast.parse((REPO / "ibpo_lit" / "module.py").read_text(encoding="utf-8"))
    (step,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "training_step"]
    lines = step.end_lineno - step.lineno + 1
    assert lines <= 35, f"IBPOModule.training_step is {lines} lines: hand the new work to ibpo_lit.training"
