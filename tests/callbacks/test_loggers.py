"""W&B and MLflow through `trainer.logger`, offline (issue 20, item 6): a tiny fit's metrics reach
them, `RolloutSamples` shows its rollouts in each, and a comparison arm keeps the user's logger
while adding the TensorBoard events its summaries are read from."""
from __future__ import annotations

import glob
import json
import os
import sys

import pytest

from ibpo_lit.__main__ import main
from ibpo_lit.experiments.arms import with_tensorboard

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")
SAMPLES = '{"class_path": "callbacks.RolloutSamples", "init_args": {"every_n_steps": 1}}'


def _fit(root, logger: str):
    sys.argv = sys.argv[:1]
    return main(["fit", "--config", TINY, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(root),
                 "--trainer.enable_progress_bar", "false", "--trainer.logger", logger,
                 "--trainer.callbacks+", SAMPLES])


@pytest.mark.slow
def test_wandb_offline_gets_the_metrics_and_the_samples_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    logger = json.dumps({"class_path": "lightning.pytorch.loggers.WandbLogger",
                         "init_args": {"project": "ibpo-lit-test", "offline": True, "save_dir": str(tmp_path)}})
    cli = _fit(tmp_path, logger)
    run = cli.trainer.logger.experiment
    # An offline run keeps its history in a binary log that only `wandb sync` reads; the run's
    # summary (the last value of every key) is what this process can check.
    assert run.summary["train/reward"] == pytest.approx(float(cli.trainer.logged_metrics["train/reward"]))
    assert run.summary["trainer/global_step"] == 1  # the second of two steps (0-based, as Lightning logs them)
    run.finish()
    (folder,) = glob.glob(os.path.join(str(tmp_path), "wandb", "offline-run-*"))
    tables = sorted(glob.glob(os.path.join(folder, "files", "media", "table", "samples_*.table.json")))
    assert len(tables) == 2  # one per step
    table = json.loads(open(tables[-1]).read())
    assert table["columns"] == ["uid", "gold", "reward", "shaped_reward", "response"] and table["data"]


@pytest.mark.slow
def test_mlflow_file_store_gets_the_metrics_and_the_samples(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    # MLflow 3 refuses a file store unless asked (it wants a database); a file store is what
    # works with no server and no extra packages.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    logger = json.dumps({"class_path": "lightning.pytorch.loggers.MLFlowLogger",
                         "init_args": {"experiment_name": "ibpo-lit-test", "tracking_uri": uri}})
    cli = _fit(tmp_path, logger)
    run_id = cli.trainer.logger.run_id
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(run_id, "train/reward")
    assert [m.step for m in history] == [0, 1]
    assert history[-1].value == pytest.approx(float(cli.trainer.logged_metrics["train/reward"]))
    artifacts = [a.path for a in client.list_artifacts(run_id, "samples")]
    assert artifacts == ["samples/step_0000000.md", "samples/step_0000001.md"]
    # samples.jsonl is the run's own, beside its checkpoints, not in the store every run shares.
    assert os.path.isfile(tmp_path / "samples.jsonl") and not os.path.exists(tmp_path / "mlruns" / "samples.jsonl")


def test_an_arm_keeps_the_users_logger_and_adds_tensorboard():
    wandb = {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"project": "p"}}
    tb = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "x"}}
    assert with_tensorboard(wandb, "runs/a") == [wandb, {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                                                        "init_args": {"save_dir": "runs/a"}}]
    assert with_tensorboard([wandb, tb], "runs/a") == [wandb, tb]
    assert with_tensorboard(True, "runs/a") is True and with_tensorboard(None, "runs/a") is None
    assert with_tensorboard(False, "runs/a")[0]["init_args"] == {"save_dir": "runs/a"}
