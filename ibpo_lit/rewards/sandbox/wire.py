"""Framing and a data-only codec for the pipes between the judge and the sandboxed program.

This file runs in three places: imported in the trainer (tests), and as source text prepended to
`judge.py` and `child.py`, which run as ``python -I -S -c`` (``-s -S``). So it imports only the standard
library, defines no ``from __future__`` line, and nothing in it names the package.

What is covered:
- Frames: a 4-byte big-endian length, then that many bytes of UTF-8 JSON. `read_frame` refuses a
  frame longer than ``max_bytes`` before reading it, so a sender cannot make the reader allocate
  without bound.
- Values: None, bool, int, float (nan/inf included), str as JSON scalars; everything else as a
  one-key object: ``{"l": [...]}`` list, ``{"t": [...]}`` tuple, ``{"s": [...]}`` set, ``{"f": [...]}``
  frozenset, ``{"d": [[k, v], ...]}`` dict, ``{"b": hex}`` bytes, ``{"y": hex}`` bytearray,
  ``{"i": hex}`` an int too long for a JSON number, ``{"c": [re, im]}`` complex. References:
  ``{"h": id, "t": type}`` an object that stays in the program (a handle), ``{"n": name}`` a global
  of the program, ``{"bi": name}`` a builtin.
- `decode` builds exact built-in types only (never a subclass, never by calling anything the
  sender names), so a value decoded in the judge compares with the judge's own ``==``.

- Bounds on what a sender can make `decode` build: ``max_items`` values and `MAX_DEPTH` levels.

What is not covered:
- Cycles and nesting deeper than the JSON parser's recursion limit: encoding raises
  (RecursionError, ValueError), which the caller treats as a failed call.
- The cost of hashing: a set or dict of values whose hashes collide (ints are not salted) takes
  quadratic time to build; the caller's watchdog on the judge bounds it (a timeout).
"""
import json
import os
import struct

_HEADER = struct.Struct(">I")
_SMALL_INT = 1 << 62  # ints beyond this go as hex (JSON readers and int_max_str_digits)


class WireError(Exception):
    """A malformed or oversized frame, or a value that cannot be sent."""


def write_frame(fd, obj):
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogatepass")
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd, max_bytes):
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    if n > max_bytes:
        raise WireError(f"frame of {n} bytes exceeds the limit of {max_bytes}")
    try:
        return json.loads(_read_exact(fd, n).decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as e:
        raise WireError(f"malformed frame: {e}") from None


def encode(obj, other):
    """``obj`` as wire data; ``other(obj)`` encodes what is not plain data (or raises)."""
    if obj is None or obj is True or obj is False:
        return obj
    if isinstance(obj, int):  # int subclasses (IntEnum, ...) go as their value
        obj = int(obj)
        return obj if -_SMALL_INT < obj < _SMALL_INT else {"i": format(obj, "x")}
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, (list, tuple, set, frozenset)):
        tag = "l" if isinstance(obj, list) else "t" if isinstance(obj, tuple) else \
            "f" if isinstance(obj, frozenset) else "s"
        return {tag: [encode(x, other) for x in obj]}
    if isinstance(obj, dict):
        return {"d": [[encode(k, other), encode(v, other)] for k, v in obj.items()]}
    if isinstance(obj, bytes):
        return {"b": bytes(obj).hex()}
    if isinstance(obj, bytearray):
        return {"y": bytes(obj).hex()}
    if isinstance(obj, complex):
        return {"c": [obj.real, obj.imag]}
    return other(obj)


_SEQUENCES = {"l": list, "t": tuple, "s": set, "f": frozenset}
MAX_DEPTH = 100  # nesting of decoded values; deeper is refused (no legitimate answer nests so)


def decode(data, ref, max_items=None):
    """Plain built-in values from wire data; ``ref(tag, value, data)`` resolves "h", "n", "bi".

    At most ``max_items`` values in all (None: no limit) and `MAX_DEPTH` levels: what a sender
    can make the decoder build is bounded, beyond the frame's byte limit.
    """
    budget = [max_items if max_items is not None else -1]
    return _decode(data, ref, budget, 0)


def _decode(data, ref, budget, depth):
    if budget[0] == 0:
        raise WireError("too many items")
    budget[0] -= 1
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if not isinstance(data, dict) or not data:
        raise WireError(f"not wire data: {type(data).__name__}")
    if depth >= MAX_DEPTH:
        raise WireError(f"nested deeper than {MAX_DEPTH}")
    tag = next(iter(data))
    value = data[tag]
    try:
        if tag in _SEQUENCES:
            return _SEQUENCES[tag](_decode(x, ref, budget, depth + 1) for x in _as_list(value))
        if tag == "d":
            return {_decode(k, ref, budget, depth + 1): _decode(v, ref, budget, depth + 1)
                    for k, v in _as_list(value)}
        if tag == "i":
            return int(value, 16)
        if tag == "b":
            return bytes.fromhex(value)
        if tag == "y":
            return bytearray.fromhex(value)
        if tag == "c":
            return complex(float(value[0]), float(value[1]))
    except (TypeError, ValueError, IndexError, KeyError, OverflowError) as e:  # unhashable key, bad hex or pair
        raise WireError(f"bad {tag!r} value: {str(e)[:200]}") from None
    if tag in ("h", "n", "bi"):
        return ref(tag, value, data)
    raise WireError(f"unknown tag {tag[:20]!r}")  # (the sender's text: bounded)


def _as_list(value):
    if not isinstance(value, list):
        raise WireError(f"expected a list, got {type(value).__name__}")
    return value
