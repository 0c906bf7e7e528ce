"""The README's quick-start ``fit`` prints no warnings and no library noise (issue 18, item 7).

The run is the quick-start config itself (configs/smollm2_135m_cpu.yaml: its trainer, precision,
callbacks, checkpointing, data) with the model swapped for the built-in tiny one, so that it
needs no download and takes seconds; five steps reach the checkpoint (every 4 steps) and the
RolloutSamples callback (every 5). It runs as a user runs it: a fresh process, Python's default
warning filters (no ``PYTHONWARNINGS``), output as printed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Lines that a first run used to print, each with what printed it:
KNOWN_NOISE = (
    # Lightning's rank-zero tip on every Trainer without a LitLogger.
    "💡 Tip",
    "litlogger",
    "litmodels",
    # Lightning 2.6's `_pytree.py` builds torch's deprecated `LeafSpec()` (FutureWarning).
    "LeafSpec",
    "is deprecated",
    # Lightning on an empty val_dataloader (`[]`) when validation is off.
    "across ranks is zero",
)
# `warnings.showwarning`'s format ("file.py:12: UserWarning: ..."), and Lightning's own
# shorter one for warnings raised in its package ("file.py:12: message").
WARNING_LINE = re.compile(r"\.py:\d+: |\bWarning\b|Warning:")


@pytest.mark.slow
def test_quick_start_fit_prints_no_warnings_or_noise(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "IBPO_LIT_DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "ibpo_lit", "fit", "--config", str(REPO / "configs" / "smollm2_135m_cpu.yaml"),
           "--model.model", "tiny-llama", "--trainer.max_steps", "5",
           "--trainer.default_root_dir", str(tmp_path / "run")]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "`Trainer.fit` stopped: `max_steps=5` reached." in output, output[-4000:]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()

    # Progress bars redraw with carriage returns: every redraw is a line of its own.
    lines = [line for line in re.split(r"[\r\n]", output) if line.strip()]
    warnings_printed = [line for line in lines if WARNING_LINE.search(line)]
    noise = [line for line in lines if any(s in line for s in KNOWN_NOISE)]
    assert not warnings_printed, "warnings printed by the quick-start run:\n" + "\n".join(warnings_printed)
    assert not noise, "library noise printed by the quick-start run:\n" + "\n".join(noise)
