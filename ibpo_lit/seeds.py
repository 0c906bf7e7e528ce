"""Which seed each random stream of a run uses: one rule, one floor below every room that samples.

What is covered:
- `stream_seed`, the one place that decides a stream's seed: its own setting when given
  (``model.rollout.seed``, ``data.seed``, ``data.arithmetic.seed``, ``model.algorithm.ciw.seed``,
  a callback's ``seed``); unset, the run's seed (`run_seed`): ``seed_everything``'s, which
  Lightning keeps in ``PL_GLOBAL_SEED`` (LightningCLI sets it before it builds anything and
  Lightning's launchers hand it to the processes they start; under torchrun or srun each process
  runs the command line and sets it itself); without one, 0 (`DEFAULT_SEED`), so code that never
  calls ``seed_everything`` (scripts, the Python API) has a defined default and
  ``seed_everything: 0`` reproduces the runs made before the knob decided anything.
- Each component resolves its seeds once, when it is built; a checkpoint records them and
  `check_resumed_seeds` refuses to resume under others.

What is not covered:
- The global generators (Python, NumPy, torch): ``seed_everything`` seeds them itself, and
  checkpoints carry their states (`ibpo_lit.training.rng_state`).
- The per-rollout seeds drawn from a stream's seed: `ibpo_lit.training.seeding`.
- ``seed_everything: true``: Lightning's choice. Lightning 2.6 reads ``PL_GLOBAL_SEED`` and falls
  back to 0 (it draws nothing at random); whatever it picks is written into the run's
  ``config.yaml`` and its checkpoints, and a resumed ``fit`` takes it from the checkpoint.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional

DEFAULT_SEED = 0  # the run's seed when nothing set one: today's runs, and every run before the knob
SEED_ENV = "PL_GLOBAL_SEED"  # where Lightning's `seed_everything` leaves its seed (and its launchers look)


def run_seed() -> int:
    """The run's seed: ``seed_everything``'s (``PL_GLOBAL_SEED``), or `DEFAULT_SEED` when no
    one called it in this process (nor in the one that launched it)."""
    value = os.environ.get(SEED_ENV)
    if value is None or not value.strip():
        return DEFAULT_SEED
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{SEED_ENV}={value!r} is not an integer seed (Lightning's seed_everything sets it)") from None


def stream_seed(explicit: Optional[int], run: Optional[int] = None) -> int:
    """The seed of one random stream: ``explicit`` (the stream's own setting) when given, else
    ``run`` (default: `run_seed`)."""
    if explicit is not None:
        return int(explicit)
    return run_seed() if run is None else int(run)


def check_resumed_seeds(saved: Optional[Mapping[str, int]], current: Mapping[str, int], what: str) -> None:
    """Refuse to resume ``what`` from a checkpoint whose stream seeds (``saved``, as the
    checkpoint recorded them; None: a checkpoint from before they were recorded) differ from the
    ones it was built with (``current``): the resumed run would sample other streams from
    mid-run on. ``fit --ckpt_path`` takes the checkpoint's ``seed_everything`` first, so this
    fires for a module or data module built in Python with other seeds, or for a stream seed
    set to another value on the command line."""
    if not saved:
        return
    differ = {k: (saved[k], current[k]) for k in current if k in saved and saved[k] != current[k]}
    if differ:
        listed = ", ".join(f"{k} {old} (now {new})" for k, (old, new) in differ.items())
        raise ValueError(
            f"the checkpoint's {what} ran with seeds {listed}: a resumed run would sample other streams from "
            f"here on. Resume with the checkpoint's seeds (seed_everything / the stream's own seed), or start a "
            f"new run")
