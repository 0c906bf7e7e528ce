"""The shape README's "Layout" section describes: which room imports which, no import cycles
(imports inside functions included), and which names a room may branch on. Tests of shape, not
of size: a line count invites two-line wrappers; an arrow back up or a task's name compared in
the data room is what actually bends the house."""
from __future__ import annotations

import ast
import re
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
# cache_dir, precision, seeds, config_keys.
BASE = {"registry", "errors", "fsync", "file_lock", "cache_dir", "precision", "seeds"}
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


# ------------------------------------------------------------------ the one way to ../shared
# A user's clone has no ../shared beside it, so a test that reads that folder must skip there.
# Tests reach it only through the `shared_data` fixture of tests/conftest.py, which skips when the
# folder or the file is absent; any other way (a relative join, `parents[..] / "shared"`, an
# absolute /work/shared) has come back after being removed, so every file under tests/ is
# scanned for one. Python files are read as code (string constants, where they are used), other
# files line by line; comments reach nothing and are not read.
TESTS = REPO / "tests"
# Only the fixture's definition names the folder; this file's pattern and example lines show the
# guard at work. Each entry: a file and the top-level names (a function, an assignment) it may
# name the folder in.
ONE_WAY = {TESTS / "conftest.py": {"shared_data"},
           TESTS / "test_layout.py": {"SHARED_IN_A_PATH", "WAYS_TO_SHARED", "NOT_WAYS_TO_SHARED"}}
# The word beside a slash (either kind) in a string: "../shared/data", "/work/shared",
# f"{root}/shared". Word boundaries keep "/shared_prompt", "unshared/", "/sharedness" out.
SHARED_IN_A_PATH = re.compile(r"[/\\]shared\b|\bshared[/\\]", re.IGNORECASE)


def _harmless_bare_word(node: ast.Constant, parents: dict) -> bool:
    """Whether a constant spelled exactly ``shared`` is a name rather than a path part: a dict's
    key, a comparison's operand, a subscript, or an element of a list, tuple or set that holds no
    ``".."`` (a parametrize id). Everywhere else (a call's argument, ``/`` or ``+``, an assignment)
    it may be joined onto a path, so it is refused; a test that needs the word there can spell it
    otherwise."""
    parent = parents.get(node)
    if isinstance(parent, ast.Dict):
        return node in parent.keys
    if isinstance(parent, (ast.List, ast.Tuple, ast.Set)):
        return not any(isinstance(e, ast.Constant) and e.value == ".." for e in parent.elts)
    return isinstance(parent, (ast.Compare, ast.Subscript))


def _ways_to_shared(source: str, allowed: set[str] = frozenset(), python: bool = True) -> list[tuple[int, str]]:
    """``(line, text)`` of every way ``source`` names the shared folder, outside the top-level
    definitions named in ``allowed``."""
    if not python:
        return [(n, line.strip()) for n, line in enumerate(source.splitlines(), 1) if SHARED_IN_A_PATH.search(line)]
    tree = ast.parse(source)
    spans = [range(n.lineno, n.end_lineno + 1) for n in tree.body
             if {getattr(n, "name", None), *(getattr(t, "id", None) for t in getattr(n, "targets", []))} & allowed]
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if any(node.lineno in span for span in spans):
            continue
        if SHARED_IN_A_PATH.search(node.value) or (
                node.value.strip().lower() == "shared" and not _harmless_bare_word(node, parents)):
            found.append((node.lineno, repr(node.value)))
    return sorted(found)


def test_tests_reach_the_shared_folder_only_through_the_fixture():
    wrong = []
    for path in sorted(TESTS.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            source = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        for line, text in _ways_to_shared(source, ONE_WAY.get(path, set()), python=path.suffix == ".py"):
            wrong.append(f"{path.relative_to(REPO)}:{line}: {text}")
    assert not wrong, ("reach the workspace's data folder only through the `shared_data` fixture (tests/conftest.py), "
                       "which skips where it is absent, as in a user's clone:\n" + "\n".join(wrong))


def test_the_one_way_exists_and_is_the_only_exception():
    """The exemptions name real definitions (a renamed fixture would otherwise leave the guard
    exempting nothing and the tests calling a fixture that is gone), and the fixture's own body
    is what the guard would refuse anywhere else."""
    for path, names in ONE_WAY.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {getattr(n, "name", None) for n in tree.body} | {
            getattr(t, "id", None) for n in tree.body for t in getattr(n, "targets", [])}
        assert names <= defined, f"{path.relative_to(REPO)} no longer defines {sorted(names - defined)}"
    conftest = (TESTS / "conftest.py").read_text(encoding="utf-8")
    assert _ways_to_shared(conftest), "the fixture would not be caught outside its exemption"
    assert not _ways_to_shared(conftest, {"shared_data"})


def test_the_fixture_skips_where_a_file_is_absent(shared_data):
    """Absent here or in a user's clone alike: a skip naming the file, never an error."""
    with pytest.raises(pytest.skip.Exception, match=r"needs the workspace's .*no_such_file\.jsonl beside the clone"):
        shared_data("no_such_file.jsonl")


# The ways the folder has been (or could be) reached: Python sources, and a line of another file
# (marked "text:"). Each must be caught.
WAYS_TO_SHARED = [
    'SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")',
    'MBPP = Path(__file__).parents[3] / "shared" / "data" / "mbpp_full.jsonl"',
    'SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"',
    'DATA = Path("/work/shared/data")',
    'GSM8K = os.path.join(ROOT, "../shared/data", "gsm8k_test.jsonl")',
    'folder = f"{root}/../shared/data"',
    'folder = "..\\\\shared\\\\data"',
    'data = ROOT.parent.joinpath("shared", "data")',
    'data = os.path.join(*["..", "shared"])',
    'data = root + os.sep + "shared"',
    'NAME = "shared"',
    'os.path.join(\n    ROOT,\n    "..",\n    "Shared",\n)',
    'pytest.skip("needs ../shared/data/gsm8k_train.jsonl")',
    "text:path: ../shared/data/x.jsonl",
]
# Words that only look like it: none may be caught.
NOT_WAYS_TO_SHARED = [
    '"""A shared prompt for the group, shared by every row; the shared data folder."""',
    '@pytest.mark.parametrize("path", ["per_row", "shared", "chunked"])\ndef test(path):\n    pass',
    'options = {"per_row": {"single_pass": True}, "shared": {}}[path]',
    'if mode == "shared" or modes["shared"]:\n    pass',
    'shared_prompt = build(shared=True, name="shared_prompt")',
    'text = "unshared/ and /sharedness and /shared_prompt"',
    'x = 1  # run by hand with --data ../shared/data',
    'text:{"text": "a shared prompt, shared_prompt"}',
]


def _example(source: str) -> tuple[str, list[tuple[int, str]]]:
    """The example as a file (another file's line second, after a harmless one) and what the guard finds."""
    text = source.startswith("text:")
    source = "first line\n" + source[5:] if text else source
    return source, _ways_to_shared(source, python=not text)


@pytest.mark.parametrize("source", WAYS_TO_SHARED)
def test_each_way_to_the_shared_folder_is_caught(source):
    source, found = _example(source)
    assert found, source
    lines = source.splitlines()
    assert all("shared" in lines[line - 1].lower() for line, _ in found)  # the line named is the one


@pytest.mark.parametrize("source", NOT_WAYS_TO_SHARED)
def test_the_word_shared_alone_is_not_caught(source):
    assert not _example(source)[1], source


def test_the_product_names_no_path_of_this_workspace():
    """The data loaders take a path: the workspace's folders (/work/...) are for the tests'
    fixture and for scripts run by hand, never for the package."""
    assert not [str(p.relative_to(REPO)) for p in PRODUCT if "/work/" in p.read_text(encoding="utf-8")]
