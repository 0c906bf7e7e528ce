"""Code tasks: HumanEval, MBPP (full and sanitized) and LiveCodeBench files as `CodeTask`s.

Each task carries the problem text to show the model, its tests as a `CodeTests` (what the
sandbox runs), the gold string for ``REWARDS["code"]`` (``CodeTests.to_gold()``, format 2) and,
where the benchmark has one, the reference solution. `CodeTask.to_record` gives the `Record` the
datamodule's record source takes (problem, gold, uid).

The sandbox's contract (`CodeTests`): the tests and ``setup`` run in the judge (trusted); the
only names it takes from the untrusted program are the entry points, ``remote``. Every other name
the tests or the setup read must come from the judge's ``prelude``, the setup, the tests
themselves, the builtins, or be a standard-library module used as ``module.attr`` (else the run is
unscorable). ``prefix`` and ``suffix`` run in the program, before and after the solution; the
tests see nothing the suffix defines.

What is covered:
- HumanEval (``task_id``, ``prompt``, ``entry_point``, ``canonical_solution``, ``test``): the
  program is ``prompt + completion`` (so a completion may be a bare body or a whole function);
  one test, the file's ``check`` called on the entry point. The prompt is also the judge's
  prelude (helpers such as ``poly`` that ``check`` calls stay trusted); the entry point is the
  only name taken from the program. ``test`` must parse and define ``check``, and ``check`` must
  hold an ``assert`` (else `BadRecordError`; ``allow_non_assert=True`` accepts one without).
- MBPP full (``text``, ``code``, ``test_list``, ``test_setup_code``, ...): ``\\r\\n`` turned into
  ``\\n``; the tests are ``test_list`` (``challenge_test_list`` is not used); ``test_setup_code``
  is the judge's setup (tasks 367 and 927 build ``Node`` objects: they are made in the program
  with its class, the judge holds handles). MBPP sanitized (``prompt`` instead of ``text``;
  ``test_imports``): the imports are the program's suffix (upstream puts them after the
  solution in one file) and the judge's prelude; there is no setup. Entry points (``remote``):
  the reference's top-level functions and classes that the tests or the setup name (so task
  126's ``sum`` is the program's, not the builtin; 367's ``Node`` too). A top-level import of the
  reference that binds a name the tests or setup read (task 596: ``import sys`` for
  ``sys.getsizeof`` on the expected side) goes to the prelude, so the judge, not the program,
  defines what the result is compared with. Every test must be assert statements only (a bare
  call passes whenever it does not raise, whatever it returns): any other is a `BadRecordError`
  naming the file, line and field ``test_list``, unless ``allow_non_assert=True``. The problem
  text is the task followed by ``shown_tests`` of its asserts (all three by default, as in the
  original MBPP prompt; fewer makes memorising them harder in training). Splits by ``task_id``:
  1-10 "prompt", 11-510 "test", 511-600 "validation", 601-974 "train".
- LiveCodeBench (``question_title``, ``question_content``, ``platform``, ``question_id``,
  ``contest_date``, ``starter_code``, ``difficulty``, ``public_test_cases``,
  ``private_test_cases``, ``metadata``): test cases are a JSON list of ``{input, output,
  testtype}``; private ones may instead be base64(zlib(pickle(json))) as in
  ``code_generation_lite`` (unpickled with every class lookup refused: only a str comes out).
  ``stdin`` problems are run once per test case on stdin; ``functional`` ones become asserts
  ``Solution().<func_name>(*args) == expected`` (a returned tuple compared as a list, as
  LiveCodeBench does; ``Solution`` is the entry point). Both get LiveCodeBench's import header as
  prefix, stop at the first failed test, and use LiveCodeBench's prompt wording.
  ``start_date``/``end_date`` filter on ``contest_date`` (v6 is 2025-02-01 to 2025-05-31).
- `extract_code` (re-exported from `ibpo_lit.rewards.code`): the last ```python block, else the
  last plain ``` block, else the raw text.

What is not covered:
- Downloading: the files are local JSON Lines (the shared data folder; LiveCodeBench v6 is not
  there, the tests use small hand-written files in its format).
- Few-shot prompts (MBPP's tasks 1-10 are just a split here).
- Whether a test can be resolved by the judge is not checked at load beyond the above (the
  shipped HumanEval and MBPP files all resolve; the judge reports a name nothing defines).
- LiveCodeBench takes no ``allow_non_assert``: its functional tests are asserts we write.
"""
from __future__ import annotations

import ast
import base64
import io
import json
import pickle
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from ibpo_lit.data.records import BadRecordError, Record, json_lines, parse_json_object
from ibpo_lit.rewards.code import CodeTests, extract_code

MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}
LCB_FUNCTIONAL_FORMAT = ("You will use the following starter code to write the solution to the problem and "
                         "enclose your code within delimiters.")
LCB_STDIN_FORMAT = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not "
                    "directly test on the sample inputs). Enclose your code within delimiters as follows. "
                    "Ensure that when the python program runs, it reads the inputs, runs the algorithm and "
                    "writes output to STDOUT.")
_LCB_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                "statistics", "itertools", "functools", "operator", "io", "sys", "json")
# LiveCodeBench's header (lcb_runner testing_util.import_string): star imports, then plain imports.
LCB_IMPORTS = ("".join(f"from {m} import *\n" for m in (*_LCB_MODULES, "builtins", "typing"))
               + "".join(f"import {m}\n" for m in _LCB_MODULES) + "sys.setrecursionlimit(50000)\n")
_LCB_PRELUDE = "def _as_lcb(x):\n    return list(x) if isinstance(x, tuple) else x\n"

__all__ = [
    "CODE_LOADERS", "CodeTask", "extract_code",
    "load_code_tasks", "load_humaneval", "load_livecodebench", "load_mbpp", "load_mbpp_sanitized",
    "mbpp_split",
]


@dataclass(frozen=True)
class CodeTask:
    uid: str  # "HumanEval/0", "mbpp/601", "mbpp_sanitized/602", LiveCodeBench's question_id
    problem: str  # the text shown to the model (without the answer-format instruction)
    spec: CodeTests  # what the sandbox runs
    gold: str  # spec.to_gold(): the gold string of REWARDS["code"]
    entry_point: str | None = None  # the function (or class) under test, where there is one
    reference: str | None = None  # the benchmark's own solution, where it has one
    split: str | None = None  # MBPP's split by task_id
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def tests(self) -> tuple:
        return self.spec.tests

    @property
    def setup(self) -> str:
        return self.spec.setup

    def to_record(self) -> Record:
        return Record(problem=self.problem, gold=self.gold, uid=self.uid)


def _task(uid: str, problem: str, spec: CodeTests, **kwargs) -> CodeTask:
    return CodeTask(uid=uid, problem=problem, spec=spec, gold=spec.to_gold(), **kwargs)


def _read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """``(line, object)`` of a benchmark's JSONL file, by the training data's reader (one error style)."""
    for line_no, raw in json_lines(path):
        yield line_no, parse_json_object(raw, path, line_no)


def _field(obj: dict, key: str, path, line: int, kind: type = str):
    if key not in obj:
        raise BadRecordError(path, line, key, "missing")
    value = obj[key]
    if not isinstance(value, kind):
        raise BadRecordError(path, line, key, f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def _limited(tasks: Iterator[CodeTask], limit: int | None) -> list[CodeTask]:
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    return list(islice(tasks, limit))


# ------------------------------------------------------------------ HumanEval
def load_humaneval(path: str | Path, limit: int | None = None, allow_non_assert: bool = False) -> list[CodeTask]:
    """HumanEval problems from ``HumanEval.jsonl`` (gunzipped), in file order.

    ``allow_non_assert``: accept a ``test`` whose ``check`` holds no ``assert`` (by default a
    `BadRecordError`: such a check passes any program that does not raise).
    """
    def tasks():
        for line, obj in _read_jsonl(path):
            prompt, entry = _field(obj, "prompt", path, line), _field(obj, "entry_point", path, line)
            test = _field(obj, "test", path, line)
            _check_humaneval_test(test, path, line, allow_non_assert)
            spec = CodeTests(kind="assert", tests=(f"{test}\ncheck({entry})\n",), prefix=prompt,
                             prelude=prompt, remote=(entry,))
            problem = f"Complete the following Python function:\n\n```python\n{prompt}```"
            yield _task(_field(obj, "task_id", path, line), problem, spec, entry_point=entry,
                        reference=prompt + obj.get("canonical_solution", ""))
    return _limited(tasks(), limit)


def _check_humaneval_test(test: str, path, line: int, allow_non_assert: bool) -> None:
    """``test`` parses and defines ``check`` (the judge calls it), which asserts something."""
    try:
        tree = _parse(test)
    except SyntaxError as e:
        raise BadRecordError(path, line, "test", f"does not parse: {e}") from None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise BadRecordError(path, line, "test", "defines no function `check`")
    if not allow_non_assert and not any(isinstance(n, ast.Assert) for n in ast.walk(checks[-1])):
        raise BadRecordError(path, line, "test", "`check` holds no assert statement, so it would pass any "
                             "program that does not raise (allow_non_assert=True accepts it)")


# ------------------------------------------------------------------ MBPP
def mbpp_split(task_id: int) -> str:
    """The conventional MBPP split of ``task_id``."""
    for name, (lo, hi) in MBPP_SPLITS.items():
        if lo <= task_id <= hi:
            return name
    raise ValueError(f"MBPP task_id {task_id} is outside 1..974")


def _parse(source: str) -> ast.Module:
    with warnings.catch_warnings():  # MBPP's regexes use invalid escapes ("\\d"): not our concern here
        warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
        return ast.parse(source)


def _defined_names(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _imports(tree: ast.Module) -> dict[str, str]:
    """The names the top-level imports of ``tree`` bind, each with its import statement's source."""
    bound = {}
    for node in tree.body:
        if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level == 0):
            for alias in node.names:
                if alias.name != "*":  # binds names we cannot know here; the judge reports any left unbound
                    bound[(alias.asname or alias.name).split(".")[0]] = ast.unparse(node)
    return bound


def _used_names(trees: list[ast.Module]) -> set[str]:
    return {n.id for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _parsed(sources: list[str], path, line: int, key: str) -> list[ast.Module]:
    try:
        return [_parse(s) for s in sources]
    except SyntaxError as e:
        raise BadRecordError(path, line, key, f"does not parse: {e}") from None


def _check_asserts(tests: list[str], trees: list[ast.Module], path, line: int) -> None:
    """Each test is assert statements only: a bare expression passes whenever it does not raise,
    whatever it returns, so a program that returns anything would score."""
    for i, (test, tree) in enumerate(zip(tests, trees)):
        if not tree.body or not all(isinstance(node, ast.Assert) for node in tree.body):
            raise BadRecordError(path, line, "test_list", f"test {i} is not an assert statement: {test[:200]!r} "
                                 "(allow_non_assert=True accepts it)")


def _lines(statements) -> str:
    return "".join(f"{s}\n" for s in dict.fromkeys(statements))


def _mbpp_tasks(path, variant: str, split: str | None, shown_tests: int | None,
                allow_non_assert: bool) -> Iterator[CodeTask]:
    if split is not None and split not in MBPP_SPLITS:
        raise ValueError(f"split must be one of {tuple(MBPP_SPLITS)} or None, got {split!r}")
    text_key = "text" if variant == "mbpp" else "prompt"
    for line, obj in _read_jsonl(path):
        task_id = _field(obj, "task_id", path, line, int)
        if split is not None and mbpp_split(task_id) != split:
            continue
        code = _field(obj, "code", path, line).replace("\r\n", "\n")
        tests = [t.replace("\r\n", "\n") for t in _field(obj, "test_list", path, line, list)]
        trees = _parsed(tests, path, line, "test_list")
        if not allow_non_assert:
            _check_asserts(tests, trees, path, line)
        # Full: test_setup_code runs in the judge. Sanitized: test_imports run after the solution
        # (the program's suffix, as upstream) and in the judge (the prelude).
        setup = obj.get("test_setup_code", "").replace("\r\n", "\n") if variant == "mbpp" else ""
        has_imports = variant == "mbpp_sanitized" and "test_imports" in obj
        test_imports = _field(obj, "test_imports", path, line, list) if has_imports else []
        used = _used_names(trees + _parsed([setup], path, line, "test_setup_code"))
        reference = _parsed([code], path, line, "code")[0]
        # The entry points: only these come from the program; every other name is the judge's.
        remote = sorted(_defined_names(reference) & used)
        if not remote:
            raise BadRecordError(path, line, "code", "defines no function or class the tests name (no entry point)")
        # What the expected side takes from the reference's imports (596: sys.getsizeof) is the judge's.
        imports = [stmt for name, stmt in _imports(reference).items() if name in used]
        shown = tests if shown_tests is None else tests[:shown_tests]
        problem = _field(obj, text_key, path, line).strip()
        if shown:
            problem += "\nYour code should pass these tests:\n\n" + "\n".join(shown)
        classes = {n.name for n in reference.body if isinstance(n, ast.ClassDef)}  # whose instances tests use
        spec = CodeTests(kind="assert", tests=tuple(tests), setup=setup, suffix=_lines(test_imports),
                         prelude=_lines([*test_imports, *imports]), remote=tuple(remote),
                         classes=tuple(n for n in remote if n in classes))
        # The entry point: of the tested definitions, the one the first test names first.
        entry = min(remote, key=lambda n: tests[0].find(n) % (len(tests[0]) + 1), default=None)
        yield _task(f"{variant}/{task_id}", problem, spec, entry_point=entry, reference=code,
                    split=mbpp_split(task_id))


def load_mbpp(path: str | Path, split: str | None = None, limit: int | None = None,
              shown_tests: int | None = None, allow_non_assert: bool = False) -> list[CodeTask]:
    """MBPP (full, ``mbpp.jsonl``) tasks, optionally of one split; ``shown_tests`` None shows all.

    ``allow_non_assert``: accept tests that are not assert statements (by default a
    `BadRecordError` naming the file, line and ``test_list``: such a test passes any program
    that does not raise).
    """
    return _limited(_mbpp_tasks(path, "mbpp", split, shown_tests, allow_non_assert), limit)


def load_mbpp_sanitized(path: str | Path, split: str | None = None, limit: int | None = None,
                        shown_tests: int | None = None, allow_non_assert: bool = False) -> list[CodeTask]:
    """MBPP sanitized (``sanitized-mbpp.json`` as JSON Lines) tasks, optionally of one split.

    ``allow_non_assert`` as in `load_mbpp`.
    """
    return _limited(_mbpp_tasks(path, "mbpp_sanitized", split, shown_tests, allow_non_assert), limit)


# ------------------------------------------------------------------ LiveCodeBench
class _NoClasses(pickle.Unpickler):
    def find_class(self, module, name):  # a JSON string needs none; anything else is refused
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")


def decode_test_cases(raw: str) -> list[dict]:
    """LiveCodeBench test cases: a JSON list, or base64(zlib(pickle(json string)))."""
    if raw.lstrip().startswith("["):
        cases = json.loads(raw)
    else:
        text = _NoClasses(io.BytesIO(zlib.decompress(base64.b64decode(raw)))).load()
        if not isinstance(text, str):
            raise ValueError(f"encoded test cases hold a {type(text).__name__}, not a JSON string")
        cases = json.loads(text)
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        raise ValueError("test cases must be a list of objects")
    return cases


def _lcb_assert(func: str, case: dict) -> str:
    args = [json.loads(line) for line in case["input"].split("\n") if line.strip()]
    expected = json.loads(case["output"])
    return f"assert _as_lcb(Solution().{func}(*{args!r})) == {expected!r}"


def load_livecodebench(path: str | Path, limit: int | None = None, start_date: str | None = None,
                       end_date: str | None = None, timeout_s: float | None = None) -> list[CodeTask]:
    """LiveCodeBench problems (``code_generation_lite`` rows); dates are ISO ``YYYY-MM-DD``, inclusive.

    ``timeout_s`` is the limit for the whole run (None: 6 s plus 0.5 s per test, at most 60 s).
    """
    def tasks():
        for line, obj in _read_jsonl(path):
            date = str(obj.get("contest_date", ""))[:10]
            if (start_date and date < start_date) or (end_date and date > end_date):
                continue
            content, starter = _field(obj, "question_content", path, line), obj.get("starter_code") or ""
            try:
                cases = decode_test_cases(_field(obj, "public_test_cases", path, line))
                if obj.get("private_test_cases"):
                    cases += decode_test_cases(obj["private_test_cases"])
                metadata = json.loads(obj.get("metadata") or "{}")
            except (ValueError, zlib.error, pickle.UnpicklingError) as e:
                raise BadRecordError(path, line, "test cases", str(e)) from None
            kinds = {c.get("testtype") for c in cases}
            if len(kinds) != 1 or not kinds <= {"stdin", "functional"}:
                raise BadRecordError(path, line, "test cases", f"expected one testtype, got {sorted(map(str, kinds))}")
            limit_s = timeout_s or min(60.0, 6.0 + 0.5 * len(cases))
            if kinds == {"functional"}:
                func = metadata.get("func_name")
                if not func:
                    raise BadRecordError(path, line, "metadata", "functional problem without func_name")
                spec = CodeTests(kind="assert", tests=tuple(_lcb_assert(func, c) for c in cases), prefix=LCB_IMPORTS,
                                 prelude=_LCB_PRELUDE, remote=("Solution",), classes=("Solution",),
                                 stop_at_first_failure=True,
                                 timeout_s=limit_s)
                problem = f"{content}\n\n{LCB_FUNCTIONAL_FORMAT}\n```python\n{starter}\n```"
            else:
                func = None
                spec = CodeTests(kind="stdin", tests=tuple({"input": c["input"], "output": c["output"]} for c in cases),
                                 prefix=LCB_IMPORTS, stop_at_first_failure=True, timeout_s=limit_s)
                problem = f"{content}\n\n{LCB_STDIN_FORMAT}\n```python\n# YOUR CODE HERE\n```"
            meta = {k: obj.get(k) for k in ("question_title", "platform", "contest_id", "contest_date", "difficulty")}
            yield _task(str(_field(obj, "question_id", path, line)), problem, spec, entry_point=func, meta=meta)
    return _limited(tasks(), limit)


# ------------------------------------------------------------------ by name
CODE_LOADERS = {
    "humaneval": load_humaneval,
    "mbpp": load_mbpp,
    "mbpp_sanitized": load_mbpp_sanitized,
    "livecodebench": load_livecodebench,
}


def load_code_tasks(name: str, path: str | Path, **kwargs) -> list[CodeTask]:
    """The tasks of code benchmark ``name`` from ``path``; ``kwargs`` go to its loader
    (``allow_non_assert`` is taken by every loader but LiveCodeBench's).

    Raises:
        ValueError: unknown name (the message lists the valid names).
    """
    try:
        loader = CODE_LOADERS[name]
    except KeyError:
        raise ValueError(f"unknown code benchmark {name!r}; valid names: {sorted(CODE_LOADERS)}") from None
    return loader(path, **kwargs)
