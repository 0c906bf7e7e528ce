"""How a judge's reply becomes a score: parsers that read only a well-formed verdict.

The response a judge is asked about was written by the policy, and it can steer the judge's
reply. A parser that takes the first YES or the first number anywhere in a reply reads verdicts
that are not there ("No ... yes" is a yes, "10/10 ... 0" a 10); one without a range, or that
takes ``inf``, ``1e9`` or ``1_0`` as numbers, lets one reply outweigh every other reward in a
weighted sum (issue 43). So each parser declares a range and reads a verdict only where one was
asked for:

* ``yes_no``: the reply's first word is YES or NO (any case), and the other word does not
  appear after it ("Yes? No." holds no verdict): 1 or 0. Range [0, 1].
* ``score_0_1``: the whole reply is a number in [0, 1]. Range [0, 1].
* ``score_0_10``: the whole reply is a number in [0, 10], or such a number followed by ``/10``;
  divided by 10. Range [0, 1].
* ``regex:<pattern>`` with the range it must declare (``options.score_range: [low, high]``):
  the pattern matches the reply exactly once, and its group 1 (the whole match without a group)
  is a number in the range.

"The whole reply" is the reply without surrounding whitespace, markdown marks (``*``, ``_``,
`````, ``#``, ``>``) and quotes, and one final full stop. "A number" is ASCII digits with an
optional sign and decimal point: not an exponent, ``inf`` or ``nan``, ``_`` separators, or
another script's digits, all of which Python's ``float`` accepts.

A declared label (``options.label``, e.g. ``Verdict``) reads the verdict from the reply's one
line that starts with ``Verdict:`` (markdown marks around the label allowed) instead of the
whole reply, for templates that ask for reasoning first; no such line, or several, is no
verdict.

A reply with no well-formed verdict is off-format: the judge scores it its minimum, the low end
of the parser's range (``ibpo_lit.model_rewards.judge``).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from itertools import islice
from typing import Callable, Optional, Sequence

from ibpo_lit.errors import ConfigError
from ibpo_lit.registry import Registry

REGEX_PREFIX = "regex:"
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")  # [0-9]: ASCII digits only
_MARKS = " \t\r\n*_`#>\"'"
_WORD = re.compile(r"[A-Za-z]+")
_YES_NO = re.compile(r"(yes|no)(?![A-Za-z0-9])", re.IGNORECASE)


@dataclass(frozen=True)
class VerdictParser:
    """``parser(reply)``: a score in [low, high], or None when the reply holds no well-formed
    verdict (module docstring).

    Args:
        name: As configured (``yes_no``, ``regex:...``).
        read: The verdict's text -> score or None.
        low, high: The declared range; ``low`` is what an off-format reply scores.
        label: Read the verdict from the one line ``<label>: ...`` (None: the whole reply).
    """

    name: str
    read: Callable[[str], Optional[float]]
    low: float
    high: float
    label: Optional[str] = None

    def __call__(self, reply: str) -> Optional[float]:
        text = reply if self.label is None else labelled(reply, self.label)
        value = None if text is None else self.read(text)
        return value if value is not None and math.isfinite(value) and self.low <= value <= self.high else None


def whole(text: str) -> str:
    """``text`` without surrounding whitespace, markdown marks, quotes and one final full stop."""
    text = text.strip(_MARKS)
    return text[:-1].strip(_MARKS) if text.endswith(".") else text


def number(text: str) -> Optional[float]:
    """``text`` as a number when it is one in the strict sense above (ASCII digits, sign, point)."""
    return float(text) if _NUMBER.fullmatch(text) else None


def labelled(reply: str, label: str) -> Optional[str]:
    """What follows ``<label>:`` on the reply's one line that starts with it; None without
    exactly one such line."""
    start = re.compile(rf"[\s*_#>`]*{re.escape(label)}[\s*_`]*:", re.IGNORECASE)
    found = [line[m.end():] for line in reply.splitlines() if (m := start.match(line))]
    return found[0] if len(found) == 1 else None


def read_yes_no(text: str) -> Optional[float]:
    core = whole(text)
    m = _YES_NO.match(core)
    if m is None:
        return None
    verdict = m.group(1).lower()
    other = "no" if verdict == "yes" else "yes"
    if other in (w.lower() for w in _WORD.findall(core[m.end():])):
        return None  # both words: the reply contradicts itself
    return float(verdict == "yes")


def read_score_0_1(text: str) -> Optional[float]:
    return number(whole(text))


def read_score_0_10(text: str) -> Optional[float]:
    core = whole(text)
    if core.endswith("/10"):
        core = core[:-3].rstrip()
    x = number(core)
    return None if x is None or not 0.0 <= x <= 10.0 else x / 10.0


JUDGE_PARSERS = Registry("judge parser")
JUDGE_PARSERS.register("yes_no")(VerdictParser("yes_no", read_yes_no, 0.0, 1.0))
JUDGE_PARSERS.register("score_0_1")(VerdictParser("score_0_1", read_score_0_1, 0.0, 1.0))
JUDGE_PARSERS.register("score_0_10")(VerdictParser("score_0_10", read_score_0_10, 0.0, 1.0))


def _regex_reader(pattern: re.Pattern) -> Callable[[str], Optional[float]]:
    def read(text: str) -> Optional[float]:
        matches = list(islice(pattern.finditer(text), 2))
        if len(matches) != 1:
            return None  # none, or several: which is the verdict?
        found = matches[0].group(1) if pattern.groups else matches[0].group(0)
        return None if found is None else number(found.strip())

    return read


def check_score_range(value) -> Optional[tuple[float, float]]:
    """``options.score_range`` as ``(low, high)``: two finite numbers, low < high (None: unset)."""
    if value is None:
        return None
    if (not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in value)
            or not value[0] < value[1]):
        raise ConfigError(f"judge options: score_range must be [low, high], two finite numbers with low < high, "
                          f"got {value!r}")
    return float(value[0]), float(value[1])


def get_parser(name: str, score_range: Optional[Sequence[float]] = None, label: Optional[str] = None) -> VerdictParser:
    """A parser by name (`JUDGE_PARSERS`), or ``regex:<pattern>`` with its ``score_range``.

    Raises:
        ConfigError: an unknown name (listing the valid ones), a pattern that does not compile, a
            regex without a range, a range given to a built-in parser (theirs is fixed).
    """
    bounds = check_score_range(score_range)
    if isinstance(name, str) and name.startswith(REGEX_PREFIX):
        try:
            pattern = re.compile(name[len(REGEX_PREFIX):])
        except re.error as e:
            raise ConfigError(f"judge parser {name!r}: the pattern does not compile ({e})") from e
        if bounds is None:
            raise ConfigError(f"judge parser {name!r}: a regex parser needs options.score_range: [low, high] (its "
                              "scores must lie there, and low is what a reply without a verdict scores)")
        return VerdictParser(name, _regex_reader(pattern), *bounds, label=label)
    if name not in JUDGE_PARSERS:
        raise ConfigError(f"unknown judge parser {name!r}; valid: {', '.join(JUDGE_PARSERS.names())}, "
                          f"or {REGEX_PREFIX}<pattern>")
    parser = JUDGE_PARSERS[name]
    if bounds is not None:
        raise ConfigError(f"judge parser {name!r} has its own range [{parser.low:g}, {parser.high:g}]; "
                          "options.score_range is for regex parsers")
    return dataclasses.replace(parser, label=label)
