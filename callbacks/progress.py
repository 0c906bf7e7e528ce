"""``StepProgress``: one progress display that works in a terminal and in a log file.

Lightning's default bar (rich, or tqdm) is made for epochs of batches: for an endless prompt
stream it shows "Epoch 0/-2" and a ``v_num``, and rich draws nothing at all when stdout is not
a terminal (a batch job, a CI log, ``nohup``), so a run looked dead for 20 minutes on a slow
machine. RL runs count optimizer steps, so this bar does:

- stdout is a terminal: one tqdm bar over ``trainer.max_steps`` optimizer steps, with the step's
  progress-bar metrics (reward, correction success, ...) and nothing else;
- stdout is not a terminal: one plain line per training step,
  ``step 3/16  reward 0.412  correction_success 0.250  51.8 s``, flushed at once, one line per
  validation with its ``val/*`` metrics, and one per dynamic-sampling round that ends without
  an update (Lightning's own bar counted those as steps: "6/2").

The command line adds it unless ``trainer.enable_progress_bar: false`` or another progress bar
is in ``trainer.callbacks``. It runs on global rank 0 only.

Not covered: a bar for validation batches (validation prints its result when it ends).
"""
from __future__ import annotations

import math
import sys
import time
from typing import IO, Any, Optional

from lightning.pytorch.callbacks.progress import ProgressBar


def _short(key: str) -> str:
    return key.split("/", 1)[1] if key.startswith("train/") else key


def _number(value: Any) -> Optional[float]:
    try:
        value = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def format_metrics(metrics: dict[str, Any]) -> str:
    """``reward 0.412  unscorable 3``: finite numbers, 3 decimals (whole numbers as integers: counts)."""
    parts = []
    for key, value in metrics.items():
        number = _number(value)
        if number is None:
            continue
        text = str(int(number)) if number.is_integer() else f"{number:.3f}"
        parts.append(f"{_short(key)} {text}")
    return "  ".join(parts)


class StepProgress(ProgressBar):
    """Progress by optimizer step: a bar in a terminal, a line per step otherwise.

    Args:
        interactive: Draw a bar (True) or print lines (False); unset = whether the output
            stream is a terminal.
    """

    def __init__(self, interactive: Optional[bool] = None, stream: Optional[IO[str]] = None) -> None:
        super().__init__()
        self._interactive = interactive
        self._stream = stream
        self._enabled = True
        self._bar = None
        self._tick = 0.0
        self._step = 0  # the optimizer step of the last line

    # ProgressBar's interface
    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        """The progress-bar metrics, without Lightning's ``v_num`` (the logger's version)."""
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    # where and how
    @property
    def stream(self) -> IO[str]:
        return self._stream if self._stream is not None else sys.stdout

    @property
    def interactive(self) -> bool:
        if self._interactive is not None:
            return self._interactive
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def _active(self, trainer) -> bool:
        return self._enabled and trainer.is_global_zero

    def _write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    @staticmethod
    def _total(trainer) -> Optional[int]:
        return trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None

    # hooks
    def on_train_start(self, trainer, pl_module) -> None:
        self._tick, self._step = time.perf_counter(), trainer.global_step
        if not self._active(trainer) or not self.interactive:
            return
        from tqdm.auto import tqdm

        self._bar = tqdm(total=self._total(trainer), initial=trainer.global_step, desc="train", unit="step",
                         file=self.stream, dynamic_ncols=True, leave=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._active(trainer):
            return
        now = time.perf_counter()
        seconds, self._tick = now - self._tick, now
        metrics = self.get_metrics(trainer, pl_module)
        if self._bar is not None:
            self._bar.n = trainer.global_step
            self._bar.set_postfix_str(format_metrics(metrics), refresh=False)
            self._bar.refresh()
            return
        if trainer.global_step == self._step:  # dynamic sampling: a round that found too few informative groups
            self._write(f"generation round without an update (dynamic sampling refills the batch)  {seconds:.1f} s")
            return
        self._step = trainer.global_step
        total = self._total(trainer)
        where = f"step {trainer.global_step}" + (f"/{total}" if total else "")
        text = format_metrics(metrics)
        self._write(f"{where}  {text + '  ' if text else ''}{seconds:.1f} s")

    def on_validation_end(self, trainer, pl_module) -> None:
        if not self._active(trainer) or trainer.sanity_checking:
            return
        val = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        self._write(f"validation at step {trainer.global_step}: {format_metrics(val) or 'no metrics'}")

    def on_train_end(self, trainer, pl_module) -> None:
        self._close()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
