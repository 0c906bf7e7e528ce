"""Name -> implementation tables, so a YAML config can pick a loss, an advantage scale, a
shaping variant or an aggregation by name (verl's ``register_policy_loss`` pattern).

The tables are filled by the modules that define the entries (``gspo.py``, ``grpo.py``,
``advantages.py``, ``aggregation.py``, ``shaping.py``); importing ``ibpo_lit.algorithms``
imports all of them, so the tables are complete whenever this module is reachable.

Contracts of the entries:

- ``POLICY_LOSSES[name](logp, old_logp, advantages, mask, *, token_weights=None,
  num_seqs=None, num_tokens=None, **user_kwargs) -> (loss, metrics)``.
  logp, old_logp, mask, token_weights [B, T]; advantages [B]; loss a scalar to minimise;
  metrics a dict of detached scalar tensors. ``num_seqs`` / ``num_tokens`` are the GLOBAL
  counts of the whole batch when the caller splits it into micro-batches (see
  ``aggregation.py``). Every loss accepts both keywords; GSPO ignores ``num_tokens`` (it is
  always a mean over sequences). ``user_kwargs`` are loss-specific (``eps_low``,
  ``eps_high``; GRPO also ``agg_mode``, ``ref_logp``, ``beta_kl``); passing a GRPO-only
  keyword to GSPO is a ``TypeError``, which the config validation should catch first.
- ``ADVANTAGE_SCALES[name](rewards, finite, group_index, group_mean, group_count) -> [B]``:
  the denominator of ``A = (r - mean_g) / denominator`` (see ``advantages.py``).
- ``AGGREGATIONS[name](loss_mat, mask, num_seqs, num_tokens) -> scalar`` (``aggregation.py``).
- ``SHAPING_VARIANTS[name](beta, kept_fraction) -> Delta`` when the IBPO condition holds
  (``shaping.py``); works on floats and on [B] tensors.
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


POLICY_LOSSES = Registry("policy loss")
ADVANTAGE_SCALES = Registry("advantage scale")
SHAPING_VARIANTS = Registry("shaping variant")
AGGREGATIONS = Registry("aggregation mode")


def get_policy_loss(name: str) -> Callable:
    return POLICY_LOSSES.get(name)


def get_advantage_scale(name: str) -> Callable:
    return ADVANTAGE_SCALES.get(name)


def get_shaping_variant(name: str) -> Callable:
    return SHAPING_VARIANTS.get(name)


def get_aggregation(name: str) -> Callable:
    return AGGREGATIONS.get(name)
