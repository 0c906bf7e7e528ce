"""The ``trainer.*`` section of the command line: Lightning's ``Trainer``, plus ``precision: auto``.

A function rather than a ``Trainer`` subclass: LightningCLI accepts a callable that returns a
Trainer, and jsonargparse documents every other argument from Lightning's own signature
(they pass through ``**kwargs``), so ``fit --help`` stays Lightning's. Only ``precision``
gains a value, ``auto``, resolved before Lightning sees it (`ibpo_lit.precision`).
"""
from __future__ import annotations

from typing import Literal, Optional, Union

import lightning.pytorch as pl
from lightning.fabric.connector import _PRECISION_INPUT
from lightning.pytorch.utilities import rank_zero_info

from ibpo_lit.precision import resolve_precision


def Trainer(*, precision: Optional[Union[Literal["auto"], _PRECISION_INPUT]] = None, **kwargs) -> pl.Trainer:  # noqa: N802 - named as the class it builds: the --help section title
    """Lightning's Trainer (every argument as Lightning documents it; ``precision`` also takes ``auto``).

    Args:
        precision: Lightning's precision (``32-true``, ``bf16-mixed``, ``16-mixed``, ...), or
            ``auto``: ``bf16-mixed`` where the hardware computes bf16 natively (a CPU with
            AVX512-BF16 or AMX, a GPU with bf16 support), ``32-true`` elsewhere (on an AVX2-only
            CPU bf16 is emulated and many times slower). The choice is logged. Unset: ``32-true``.
    """
    resolved, note = resolve_precision(precision, kwargs.get("accelerator", "auto"))
    if note:
        rank_zero_info(note)
    return pl.Trainer(precision=resolved, **kwargs)
