"""``Registry``: a named table of implementations of one kind, the one calling contract per table.

Used by the formulas (``ibpo_lit.algorithms.registry``: losses, advantage scales, shaping
variants, aggregations) and by the verifiers (``ibpo_lit.rewards.REWARDS``). Standard library
only: reward workers import it.
"""
from __future__ import annotations

from typing import Any, Callable, TypeVar

T = TypeVar("T")


class Registry:
    """A named table of implementations of one kind (used in error messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` stores the object under ``name``."""

        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> Any:
        """The object registered as ``name``; ``ValueError`` listing valid names otherwise."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: unhashable name from a bad config
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:  # unhashable
            return False

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"

    def __getitem__(self, name: str) -> Any:
        return self.get(name)
