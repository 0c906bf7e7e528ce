"""What kind of gold a string is, and the error a reward raises on a kind it is not for.

A gold is a string, and three kinds of string are golds here:

- ``answer``: a final answer (``"72"``, ``"\\frac{1}{2}"``), what the math reward scores.
- ``assert`` and ``stdin``: a code test spec, ``CodeTests.to_gold()``, what the code reward and
  the sandbox pool score (the program must pass its tests).
- ``run``: the spec of a tool call (``CodeTests(kind="run")``, `ibpo_lit.rewards.python_tool`):
  the program runs once and its output is returned; it has no tests, so no reward scores it.
  Scored as a code test it passed any program that exits cleanly (issue 43, item 5).

A spec is a JSON object (`gold_kind` reads its ``kind``); anything else is an answer. A gold of a
kind the reward is not for is a data or configuration error, never a score: `GoldKindError` (a
``ValueError``: the command line prints its message on one line), naming the kind found, the
reward and what to do.

Where it is refused:
- Training data: every record's gold is checked against its task's verifier when the data is
  read (``ibpo_lit.data.datamodule``, `ibpo_lit.rewards.builtin.check_gold`), naming the record.
- The math reward: any spec. `RewardPool` checks a call's golds before it scores anything.
- The code reward (`CodeTests.from_gold`, ``code_reward``, ``SandboxPool``): a spec of another
  kind (``run``). `CodeTests.to_gold` does not write a ``run`` spec at all. A string that is no
  spec at all (not a JSON object) is an unusable code gold, unscorable (None), as before: the
  code reward cannot tell an answer from a corrupted spec; the data check can, and does.

What is not covered: whether a gold of the right kind is well formed (`CodeTests.from_gold` and
math-verify say that, and an unusable gold is unscorable); rewards of your own (import paths)
take any gold.
"""
from __future__ import annotations

import json

ANSWER = "answer"
TEST_KINDS = ("assert", "stdin")  # specs with tests: the code reward's golds
RUN = "run"  # a tool call's spec: no tests, no reward's gold
SPEC_KINDS = (*TEST_KINDS, RUN)
_MEANING = {ANSWER: "a final answer", "assert": "a code test spec (asserts)",
            "stdin": "a code test spec (stdin/stdout)",
            RUN: "a tool call's spec: no tests, so any program that exits cleanly would pass"}


class GoldKindError(ValueError):
    """A gold of a kind the reward is not for (a data or configuration error, never a score)."""


def gold_kind(gold: str) -> str:
    """``answer``, or the ``kind`` of a sandbox spec (``assert``, ``stdin``, ``run``; the text of
    any other ``kind`` as written). A spec is a JSON object (no answer is: LaTeX such as
    ``{1, 2}`` is not JSON); one without ``kind`` is ``assert``, as `CodeTests.from_gold` reads
    it. Golds are data, not policy output: parsing one with ``json`` is linear in its length."""
    text = gold.lstrip()
    if not text.startswith("{"):
        return ANSWER
    try:
        obj = json.loads(text)
    except ValueError:
        return ANSWER
    if not isinstance(obj, dict):
        return ANSWER
    kind = obj.get("kind", "assert")
    return kind if isinstance(kind, str) else repr(kind)


def check_kind(reward: str, gold: str, accepted: tuple[str, ...], where: str = "") -> None:
    """Raise `GoldKindError` when ``gold`` is not of a kind in ``accepted``, the kinds ``reward``
    scores; ``where`` (a record's uid) starts the message."""
    kind = gold_kind(gold)
    if kind in accepted:
        return
    found = _MEANING.get(kind, f"a sandbox spec of unknown kind {kind!r}")
    if kind in TEST_KINDS:
        fix = "score it with the code reward (model.reward: code)"
    elif kind == ANSWER:
        fix = "score answers with the math reward (model.reward: math)"
    else:
        fix = ("no reward scores it; build code golds with the data loaders (data.code_format) or "
               "CodeTests(kind='assert' or 'stdin', ...).to_gold()")
    wanted = " or ".join(repr(k) for k in accepted)
    raise GoldKindError(f"{where + ': ' if where else ''}the {reward!r} reward scores golds of kind {wanted}, "
                        f"but this gold is of kind {kind!r} ({found}); {fix}")
