"""A user error ends ``python -m ibpo_lit`` with one readable line, ``ibpo-lit: error: ...``,
and exit status 2, before any weights load; ``IBPO_LIT_DEBUG=1`` keeps the traceback; a bug
keeps its traceback. Cross-section contradictions are rejected naming the keys."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ibpo_lit.module
from ibpo_lit.__main__ import entry_point
from ibpo_lit.errors import ConfigError, UserError, format_user_error, is_user_error

REPO = Path(__file__).resolve().parent.parent
TINY = str(REPO / "configs" / "tiny.yaml")


@pytest.fixture(autouse=True)
def _plain_argv_and_no_weights(monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the error was reported")

    monkeypatch.setattr(ibpo_lit.module, "load_policy", refuse)


def _fit(tmp_path, *overrides: str) -> list[str]:
    return ["fit", "--config", TINY, "--trainer.default_root_dir", str(tmp_path / "run"),
            "--trainer.enable_progress_bar", "false", *overrides]


def _one_line_error(capsys, args: list[str]) -> str:
    """Run the command line in-process; it must fail with status 2 and end with one error line."""
    assert entry_point(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith("ibpo-lit: error: ")
    return err[-1]


def test_a_bad_data_file_through_the_real_command_line(tmp_path):
    """The whole path a user takes: a subprocess, stderr's last line, the exit status."""
    bad = tmp_path / "train.jsonl"
    bad.write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n" + json.dumps({"answer": "#### 3"}) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("IBPO_LIT_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "ibpo_lit", *_fit(tmp_path, "--data.train_path", str(bad))],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"ibpo-lit: error: {bad}:2: field 'question': missing"


def test_debug_env_keeps_the_traceback(tmp_path, monkeypatch):
    from ibpo_lit.data.records import BadRecordError

    bad = tmp_path / "train.jsonl"
    bad.write_text("{not json\n")
    monkeypatch.setenv("IBPO_LIT_DEBUG", "1")
    with pytest.raises(BadRecordError, match=r"train.jsonl:1: malformed JSON"):
        entry_point(_fit(tmp_path, "--data.train_path", str(bad)))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--model.model", "./no/such/model"], "model.model: model path './no/such/model' does not exist"),
        (["--model.model", "runs/../no-such-dir/model"], "model.model: model path 'runs/../no-such-dir/model' does not exist"),
        (["--model.algorithm.agg_mode", "seq-mean-token-sum"],
         "algorithm.agg_mode='seq-mean-token-sum' contradicts algorithm.loss='gspo'"),
        (["--model.rollout.group_size", "1"], "rollout.group_size must be >= 2 (got 1)"),
        (["--trainer.callbacks", "[]"],
         "model.algorithm.ibpo.variant='plain' shapes rewards with correction rollouts, but no callback"),
        (["--model.rollout.num_mini_batches", "64"], "model.rollout.num_mini_batches=64 exceeds the 16 responses"),
        (["--model.rollout.backend", "vllm"], "model.rollout.backend='vllm' samples from a separate copy"),
        (["--trainer.max_steps", "-1"], "set trainer.max_steps (or model.optim.total_steps)"),
        (["--ckpt_path", "/no/such/last.ckpt"], "ckpt_path: no such checkpoint: /no/such/last.ckpt"),
        (["--model.optim.lr", "0"], "optim.lr must be > 0, got 0"),
        (["--trainer.gradient_clip_val", "1.0"], "Automatic gradient clipping is not supported for manual optimization"),
    ],
    ids=["model-path", "model-path-relative", "gspo-token-sum", "ibpo-group-of-one", "ibpo-without-corrections",
         "mini-batches", "vllm-without-sync", "no-max-steps", "ckpt-missing", "bad-value", "lightning-misconfiguration"],
)
def test_settings_rejected_in_one_line_before_weights_load(tmp_path, capsys, overrides, message):
    line = _one_line_error(capsys, _fit(tmp_path, *overrides))
    assert message in line


def test_a_directory_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    line = _one_line_error(capsys, _fit(tmp_path, "--model.model", str(tmp_path / "model")))
    assert f"model.model: model path '{tmp_path / 'model'}' is a directory without config.json" in line


def test_several_contradictions_are_reported_together(tmp_path, capsys):
    line = _one_line_error(capsys, _fit(tmp_path, "--trainer.callbacks", "[]", "--model.rollout.num_mini_batches", "64"))
    assert line.startswith("ibpo-lit: error: 2 settings to fix: ")
    assert "model.algorithm.ibpo" in line and "num_mini_batches" in line


def test_a_truncated_checkpoint_is_named(tmp_path, capsys):
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"PK\x03\x04 truncated")
    line = _one_line_error(capsys, _fit(tmp_path, "--ckpt_path", str(ckpt)))
    assert f"ckpt_path: {ckpt} is not a readable checkpoint" in line


@pytest.mark.parametrize(
    "overrides, names",
    [
        (["--model.rollout.group_sise", "3"], "group_sise"),
        (["--model.rollout.group_size", "many"], "model.rollout.group_size"),
        (["--data.prompts_per_step", "1.5"], "data.prompts_per_step"),
    ],
    ids=["unknown-key", "wrong-type", "float-for-int"],
)
def test_unknown_or_mistyped_keys_are_named(tmp_path, capsys, overrides, names):
    with pytest.raises(SystemExit) as info:  # jsonargparse prints usage and the error, status 2
        entry_point(_fit(tmp_path, *overrides))
    assert info.value.code == 2
    assert names in capsys.readouterr().err


def test_unknown_key_in_a_config_file_is_named(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  rollout:\n    group_sise: 3\n")
    with pytest.raises(SystemExit) as info:
        entry_point(_fit(tmp_path, "--config", str(config)))
    assert info.value.code == 2
    assert "group_sise" in capsys.readouterr().err


def _raise_value_error_here():
    raise ValueError("a bug, not a setting")


def test_only_validation_errors_are_user_errors():
    from ibpo_lit.data.records import RecordFormat

    with pytest.raises(ValueError) as own:
        RecordFormat(answer_format="latex")
    assert is_user_error(own.value)
    with pytest.raises(ValueError) as foreign:
        _raise_value_error_here()
    assert not is_user_error(foreign.value)  # keeps its traceback
    assert is_user_error(ConfigError("x")) and is_user_error(UserError("y"))
    assert not is_user_error(RuntimeError("z"))
    assert format_user_error(FileNotFoundError(2, "No such file or directory", "/x.jsonl")) == \
        "ibpo-lit: error: No such file or directory: /x.jsonl"


def test_trainer_fit_in_python_runs_the_same_checks_before_weights_load(tmp_path):
    # No command line: `IBPOModule.setup` runs `check_fit_settings` (the autouse fixture refuses loads).
    import lightning as L

    from ibpo_lit.config import RolloutConfig
    from ibpo_lit.data.datamodule import PromptDataModule
    from ibpo_lit.module import IBPOModule

    module = IBPOModule(rollout=RolloutConfig(backend="vllm"))
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        default_root_dir=str(tmp_path))
    with pytest.raises(ConfigError) as err:
        trainer.fit(module, datamodule=PromptDataModule())
    assert "2 settings to fix" in str(err.value)
    assert "model.algorithm.ibpo.variant='plain'" in str(err.value) and "callbacks.VLLMWeightSync" in str(err.value)
