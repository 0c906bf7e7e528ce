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
        (["--trainer.strategy", '{"class_path": "ibpo_lit.scale.FSDP2Strategy", "init_args": {"cpu_offload": true}}'],
         "trainer.strategy.init_args.cpu_offload: not supported yet"),
        (["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.callbacks+", "callbacks.GradientVarianceLogger"],
         "trainer.callbacks: GradientVarianceLogger measures one process's rows and gradients only, and this run has 2"),
    ],
    ids=["model-path", "model-path-relative", "gspo-token-sum", "ibpo-group-of-one", "ibpo-without-corrections",
         "mini-batches", "vllm-without-sync", "no-max-steps", "ckpt-missing", "bad-value", "lightning-misconfiguration",
         "cpu-offload", "one-process-callback"],
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
    "overrides, message",
    [
        (["--model.rollout.group_sise", "3"],
         "unknown setting: model.rollout.group_sise is not a setting (did you mean model.rollout.group_size?)"),
        (["--model.rollout.group_size", "many"], 'Parser key "model.rollout.group_size": Expected a <class \'int\'>'),
        (["--data.prompts_per_step", "1.5"], 'Parser key "data.prompts_per_step"'),
    ],
    ids=["unknown-key", "wrong-type", "float-for-int"],
)
def test_unknown_or_mistyped_keys_are_named_in_one_line(tmp_path, capsys, overrides, message):
    line = _one_line_error(capsys, _fit(tmp_path, *overrides))
    assert message in line and "--help` lists every setting" in line


def test_every_unknown_key_of_a_config_file_and_the_command_line_at_once(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  rollout:\n    group_sise: 3\n  algorithm:\n    beta_kll: 0.1\n  rolout:\n"
                      "    seed: 2\ntrainer:\n  max_stepz: 2\n")
    line = _one_line_error(capsys, _fit(tmp_path, "--config", str(config), "--model.max_steps", "3",
                                        "--model.algorithm.ciw.mdoe", "ciw"))
    assert line.startswith("ibpo-lit: error: 6 unknown settings: ")
    for bad, good in [("model.rollout.group_sise", "model.rollout.group_size"),
                      ("model.algorithm.beta_kll", "model.algorithm.beta_kl"),
                      ("model.rolout", "model.rollout"),  # a misspelt section: named once, not each key under it
                      ("trainer.max_stepz", "trainer.max_steps"),
                      ("model.max_steps", "trainer.max_steps"),  # the right name in the wrong section
                      ("model.algorithm.ciw.mdoe", "model.algorithm.ciw.mode")]:  # inside an optional dataclass
        assert f"{bad} " in line and f"(did you mean {good}?)" in line, bad
    assert f"(in {config})" in line and "model.rolout.seed" not in line


def test_free_form_and_list_values_are_left_to_their_own_checks(tmp_path):
    from ibpo_lit.__main__ import main

    # Keys inside a dict value and a callback list are not settings of ours: no "unknown setting".
    cli = main(_fit(tmp_path, "--data.chat_template_kwargs", "{enable_thinking: false}", "--trainer.callbacks+",
                    "callbacks.CorrectionMetrics")[1:], run=False)
    assert cli.datamodule.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--optimizer", "torch.optim.SGD"], "optimizer: ibpo-lit builds its optimizer itself (AdamW"),
        (["--lr_scheduler", "torch.optim.lr_scheduler.StepLR"], "lr_scheduler: ibpo-lit builds its schedule itself"),
        (["--trainer.strategy", "fsdp"], "trainer.strategy: fsdp is Lightning's FSDPStrategy (FSDP1)"),
        (["--trainer.strategy", "lightning.pytorch.strategies.FSDPStrategy"], "use trainer.strategy: fsdp2"),
        (["--trainer.strategy", "deepspeed_stage_2"], "trainer.strategy: deepspeed_stage_2 (DeepSpeed) is not supported"),
    ],
    ids=["optimizer", "lr-scheduler", "fsdp1", "fsdp1-class", "deepspeed"],
)
def test_what_the_project_does_not_take_gets_its_own_answer(tmp_path, capsys, overrides, message):
    line = _one_line_error(capsys, _fit(tmp_path, *overrides))
    assert message in line


def test_vllm_missing_is_named_before_anything_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, as where it is not installed
    line = _one_line_error(capsys, _fit(tmp_path, "--model.rollout.backend", "vllm", "--trainer.callbacks+",
                                        "callbacks.VLLMWeightSync"))
    assert "model.rollout.backend: vllm needs vLLM: `pip install -e '.[vllm]'`" in line and "ModuleNotFoundError" in line


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
