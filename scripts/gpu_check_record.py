"""The time budget and the result file of scripts/gpu_check.py (no torch here).

`Budget`: seconds since the process started (``IBPO_T0``, the shell's clock when the session
script launched Python, else the process's start time from /proc) against ``budget_s``;
``fits(estimate)`` says whether a case estimated at ``estimate`` seconds can finish in what is
left. `Record`: the JSON the check writes after every case, atomically (a temporary file in the
same folder, then ``os.replace``), so a run cut at any moment leaves the last complete version:
which cases ran (with their figures and the plan's beside them), which were skipped and why, the
calibration and the predictions made before the predicted cases ran.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Optional


def process_start() -> float:
    """Wall-clock time this process started: ``IBPO_T0`` (seconds since the epoch, set by
    scripts/gpu_session.sh just before it starts Python) or /proc's start time; now, where neither
    is readable."""
    if os.environ.get("IBPO_T0"):
        return float(os.environ["IBPO_T0"])
    try:
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        # field 22 of /proc/self/stat, counted after the command name's closing parenthesis
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return time.time()


class Budget:
    """Seconds from ``start`` that the check may use."""

    def __init__(self, seconds: float, start: Optional[float] = None) -> None:
        self.seconds = seconds
        self.start = process_start() if start is None else start

    def elapsed(self) -> float:
        return time.time() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def fits(self, estimate_s: float) -> bool:
        return estimate_s <= self.left()


class Record:
    """The check's JSON, rewritten whole after every change that matters (see the module docstring)."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.data: dict[str, Any] = {**header, "complete": False, "cases": [], "ran": [], "skipped": [],
                                     "failed": [], "predictions": {}, "calibration": None}

    def case(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Add a case (``status``: ran, skipped or failed) and write."""
        self.data["cases"].append(entry)
        key = {"ran": "ran", "skipped": "skipped", "failed": "failed"}[entry["status"]]
        self.data[key].append(entry["name"] if key == "ran" else {"name": entry["name"], "reason": entry.get("reason")})
        self.write()
        return entry

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.write()

    def write(self, complete: bool = False) -> None:
        self.data["complete"] = complete
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(_finite(self.data), f, indent=1)
                f.write("\n")
            os.chmod(tmp, 0o644)  # (mkstemp's file is the owner's alone)
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
