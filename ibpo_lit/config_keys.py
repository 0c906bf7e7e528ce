"""Unknown settings, all at once, each with a "did you mean".

jsonargparse stops at the first key it does not know and prints the whole usage (180 lines for
``fit``) with "unrecognized arguments"; in a YAML file only the first bad key is named. Before
parsing, this module collects every key the user wrote (``--a.b.c`` options, each ``--config``
file, a section's own config file such as ``--model m.yaml``) and checks them against the
parser's keys, so one error lists every misspelling with its nearest valid key
(``model.algorithm.beta_kll (did you mean model.algorithm.beta_kl?)``).

What is covered: keys of the nested settings (dataclasses such as ``model.algorithm.ibpo``,
optional ones such as ``model.algorithm.ciw`` and ``model.lora`` included), Lightning's
``trainer.*`` and ``checkpoint.*``, the top-level keys; keys the project has on purpose not
got (``optimizer``, ``lr_scheduler``) get their own answer.

What is not covered: keys inside free-form values (``data.chat_template_kwargs``), inside list
items (``model.rewards``, ``trainer.callbacks``) or under ``init_args`` of a class: jsonargparse
checks those itself after this, one at a time.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from typing import Any, Iterable, Optional

import yaml

# Keys with an answer of their own rather than a "did you mean".
REMOVED_KEYS = {
    "optimizer": "ibpo-lit builds its optimizer itself (AdamW with linear warm-up and cosine decay, fused where "
                 "supported): set model.optim.lr, weight_decay, betas, eps, warmup_ratio, min_lr_ratio, grad_clip",
    "lr_scheduler": "ibpo-lit builds its schedule itself (linear warm-up, cosine decay to a floor): set "
                    "model.optim.warmup_ratio, min_lr_ratio and total_steps",
}


@dataclasses.dataclass(frozen=True)
class KnownKeys:
    """What a parser accepts: ``leaves`` (keys that take a value) and ``open`` (those of them
    whose value may hold keys of its own that this module does not check: dicts, lists,
    classes). Section keys (``model.algorithm``) are neither: a key under one must be known."""

    leaves: frozenset
    open: frozenset
    linked: tuple = ()  # ((target, source), ...): keys set from other keys (``data.task`` from ``model.reward``)

    @property
    def sections(self) -> set[str]:
        """Every dotted prefix of a leaf (``model``, ``model.algorithm``)."""
        return {k.rsplit(".", i)[0] for k in self.leaves for i in range(1, k.count(".") + 1)}

    def accepts(self, key: str) -> bool:
        if key in self.leaves:
            return True
        parts = key.split(".")
        return any(".".join(parts[:i]) in self.open for i in range(1, len(parts)))


def known_keys(parser: Any) -> KnownKeys:
    """The keys of a jsonargparse parser (a subcommand's, for LightningCLI)."""
    leaves, open_, linked = set(), set(), []
    for action in parser._actions:
        kind = type(action).__name__
        dest = action.dest
        if kind in ("_HelpAction", "_ActionHelpClassPath", "_ActionPrintConfig", "ActionConfigFile", "_ActionConfigLoad"):
            continue
        if kind == "ActionLink":  # shown as "source --> target" (source may be "fn(a, b)"): not a key of its own
            source = (action.option_strings or [""])[0].partition(" --> ")[0]
            linked.append((dest, source.split("(", 1)[-1].rstrip(")") if "(" in source else source))
            continue
        hint = getattr(action, "_typehint", None)
        fields = _dataclass_fields(hint)
        if fields is not None:  # an optional dataclass (model.lora): its fields are keys too
            leaves.add(dest)
            for name, sub_hint in fields:
                leaves.add(f"{dest}.{name}")
                if _is_open(sub_hint):
                    open_.add(f"{dest}.{name}")
            continue
        leaves.add(dest)
        if _is_open(hint):
            open_.add(dest)
    return KnownKeys(frozenset(leaves), frozenset(open_), tuple(linked))


def _dataclass_fields(hint: Any) -> Optional[list[tuple[str, Any]]]:
    """``[(name, type)]`` of a dataclass or ``Optional[dataclass]`` type; None for anything else."""
    candidates = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) is typing.Union else [hint]
    if len(candidates) != 1 or not (isinstance(candidates[0], type) and dataclasses.is_dataclass(candidates[0])):
        return None
    hints = typing.get_type_hints(candidates[0])
    return [(f.name, hints.get(f.name)) for f in dataclasses.fields(candidates[0])]


def _is_open(hint: Any) -> bool:
    """Whether a value of this type may carry keys of its own (dict, list, a class, Any)."""
    if hint is None or hint is Any:
        return True
    if isinstance(hint, type):
        return not issubclass(hint, (str, int, float, bool))
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return False
    if origin is typing.Union:
        return any(_is_open(a) for a in args)
    return True  # dict[...], list[...], tuple[...], other generics


def user_keys(args: list[str], sections: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``[(dotted key, where)]`` of every setting in ``args`` (a subcommand's arguments):
    options (``--a.b c``, ``--a.b=c``), and the keys inside each config file (``--config F``, a
    section's ``--model F`` where ``model`` is one of ``sections``). ``where`` is
    ``"command line"`` or the file."""
    sections = set(sections)
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("--") or token == "--":
            continue
        key, has_value, value = token[2:].partition("=")
        key = key.rstrip("+")  # `--trainer.callbacks+=...` appends
        if not has_value and i < len(args) and not args[i].startswith("--"):
            value, i = args[i], i + 1
        if key in ("config", "c") or (key in sections and os.path.isfile(value)):
            prefix = "" if key in ("config", "c") else key + "."
            out.extend((prefix + k, value) for k in _file_keys(value))
            continue
        out.append((key, "command line"))
    return out


def _file_keys(path: str) -> list[str]:
    """Dotted keys of a YAML file's nested mappings (not inside lists); [] when it does not read
    (jsonargparse reports an unreadable file itself)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return []
    return list(_flatten(data, "")) if isinstance(data, dict) else []


def _flatten(data: dict, prefix: str) -> Iterable[str]:
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and value and "class_path" not in value:
            yield full  # a section, or a dict value: checked as a key, then its keys
            yield from _flatten(value, full + ".")
        else:
            yield full


def unknown_key_problems(known: KnownKeys, given: list[tuple[str, str]]) -> list[str]:
    """One line per unknown key, with where it was written and a suggestion."""
    problems, seen = [], set()
    sections = known.sections
    for key, where in given:
        if key in seen or key in ("help", "print_config", "version") or known.accepts(key) or key in sections:
            continue
        parts = key.split(".")
        if any(".".join(parts[:i]) in seen for i in range(1, len(parts))):
            continue  # under a section already reported (a misspelt `model.rolout:` in YAML)
        seen.add(key)
        place = "" if where == "command line" else f" (in {where})"
        top = key.split(".")[0]
        source = dict(known.linked).get(key)
        if source is not None:
            problems.append(f"{key}{place} is not set on its own: it follows {source}; set that instead")
            continue
        if top in REMOVED_KEYS:
            problems.append(f"{key}{place}: {REMOVED_KEYS[top]}")
            continue
        guess = suggest(key, known.leaves | sections)
        problems.append(f"{key}{place} is not a setting" + (f" (did you mean {guess}?)" if guess else ""))
    return problems


def suggest(key: str, candidates: Iterable[str]) -> Optional[str]:
    """The nearest valid key: first by the whole dotted key, then by its last part anywhere
    (``model.max_steps`` -> ``trainer.max_steps``)."""
    candidates = sorted(candidates)
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.8)
    if close:
        return close[0]
    leaf = key.rsplit(".", 1)[-1]
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    by_leaf: dict[str, list[str]] = {}
    for c in candidates:
        by_leaf.setdefault(c.rsplit(".", 1)[-1], []).append(c)
    names = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
    if not names:
        return None
    options = by_leaf[names[0]]
    # Among keys with that name, the one whose section is most like the one written.
    return max(options, key=lambda c: difflib.SequenceMatcher(None, parent, c.rsplit(".", 1)[0] if "." in c else "").ratio())
