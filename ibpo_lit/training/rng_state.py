"""Every process-global random number generator, captured and restored, for exact resume.

A resumed run must draw the numbers an uninterrupted one would. ibpo-lit's own sampling does
not depend on global state (rollout, correction and reference seeds are pure functions of
``(seed, step, stream, row)``, see `ibpo_lit.training.seeding`), but libraries and user callbacks may
draw from the global generators, so a checkpoint holds those too.

What is covered:
- Python's `random`, NumPy's legacy global `np.random` generator, torch's CPU generator and,
  when CUDA has been initialised, every CUDA device's generator.
- The captured state holds only plain Python values and tensors, so it loads with
  ``torch.load(weights_only=True)`` (no pickled NumPy arrays).

What is not covered:
- Generators a library keeps privately (a `numpy.random.Generator` object, a
  `torch.Generator` held by a sampler): whoever owns one must checkpoint it.
- Several processes: each rank has its own generators, and a Lightning checkpoint is rank 0's
  dictionary, so only rank 0's state is kept. Restoring it on every rank is wrong for ranks
  whose streams must differ, so `restore_rng_state` is meant for the single-process case or
  for states gathered per rank by the caller.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng_state() -> dict[str, Any]:
    """The current state of every global generator (see the module docstring)."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "cuda": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put every generator back to ``state`` (from `capture_rng_state`).

    A CUDA state is restored only when CUDA is available with the same number of devices;
    otherwise it is ignored (a checkpoint taken on a GPU machine resumes on the CPU).
    """
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
