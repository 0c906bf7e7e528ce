"""StepProgress (issue 30, item 2): without a terminal, one plain line per optimizer step and one
per validation; in a terminal, a bar over ``max_steps`` with no epoch, no negative total and no
``v_num``; the command line adds it unless told otherwise."""
from __future__ import annotations

import io
import re
import sys
from pathlib import Path

from callbacks.progress import StepProgress, format_metrics

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")


def _cli(tmp_path, *overrides, run=False):
    from ibpo_lit.__main__ import main

    sys.argv = sys.argv[:1]
    return main(["--config", TINY, "--trainer.default_root_dir", str(tmp_path), "--trainer.max_steps", "2",
                 "--model.rollout.sampling.max_new_tokens", "6", *overrides], run=run)


def _fit_with(tmp_path, bar: StepProgress, *overrides):
    cli = _cli(tmp_path, *overrides)
    cli.trainer.callbacks[:] = [c for c in cli.trainer.callbacks if not isinstance(c, StepProgress)] + [bar]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


def test_a_log_gets_one_plain_line_per_step_and_per_validation(tmp_path):
    out = io.StringIO()  # not a terminal
    _fit_with(tmp_path, StepProgress(stream=out), "--data.val_size", "2", "--trainer.val_check_interval", "2",
              "--trainer.check_val_every_n_epoch", "null", "--trainer.num_sanity_val_steps", "0")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    for n, line in zip((1, 2), lines):
        assert re.fullmatch(rf"step {n}/2  reward [0-9.]+  .*  [0-9]+\.[0-9] s", line), line
        assert "v_num" not in line and "Epoch" not in line
    assert re.fullmatch(r"validation at step 2: val/accuracy [0-9.]+  val/response_len [0-9.]+", lines[2]), lines[2]


def test_a_terminal_gets_a_bar_over_the_steps_without_epochs_or_versions(tmp_path):
    out = io.StringIO()
    _fit_with(tmp_path, StepProgress(interactive=True, stream=out))
    drawn = out.getvalue()
    assert "train: 100%" in drawn and "2/2" in drawn and "reward" in drawn
    assert "v_num" not in drawn and "Epoch" not in drawn and "-2" not in drawn


def test_the_command_line_adds_it_unless_the_bar_is_off_or_another_is_given(tmp_path):
    from lightning.pytorch.callbacks import TQDMProgressBar

    cli = _cli(tmp_path)
    assert isinstance(cli.trainer.progress_bar_callback, StepProgress)
    assert not any(isinstance(c, StepProgress) for c in _cli(tmp_path, "--trainer.enable_progress_bar", "false").trainer.callbacks)
    cli = _cli(tmp_path, "--trainer.callbacks+", "lightning.pytorch.callbacks.TQDMProgressBar")
    assert isinstance(cli.trainer.progress_bar_callback, TQDMProgressBar)


def test_metrics_are_short_and_finite():
    text = format_metrics({"train/reward": 0.41234, "train/unscorable": 3.0, "data/skipped": 0.0,
                           "train/kl": float("nan"), "note": "x"})
    assert text == "reward 0.412  unscorable 3  data/skipped 0"


def test_dynamic_sampling_rounds_are_not_counted_as_steps(tmp_path, monkeypatch):
    # Every response scores the same: no group is informative, so each update takes max_rounds rounds.
    (tmp_path / "same_reward.py").write_text("def same(prompts, completions, **columns):\n"
                                             "    return [1.0 for _ in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = io.StringIO()
    _fit_with(tmp_path, StepProgress(stream=out), "--trainer.max_steps", "1", "--model.reward", "same_reward:same",
              "--model.algorithm.ibpo.variant", "none", "--trainer.callbacks", "[]",
              "--model.algorithm.dynamic_sampling.enabled", "true", "--model.algorithm.dynamic_sampling.max_rounds", "2")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("generation round without an update (dynamic sampling refills the batch)")
    assert lines[1].startswith("step 1/1  ") and len(lines) == 2, lines
