"""ibpo-lit: GSPO with IBPO counterfactual reward shaping, as a PyTorch Lightning application.

Importing ``ibpo_lit`` loads nothing heavy (no torch, no Lightning): the CLI, the sandbox's judge
and the reward workers import their own submodules.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ibpo-lit")
except PackageNotFoundError:  # a source tree on PYTHONPATH that was never `pip install`-ed
    __version__ = "0+unknown"
