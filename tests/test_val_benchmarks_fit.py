"""`data.val_benchmarks` in a real fit (issue 19, item 3): AIME25 and HumanEval watched while
training on arithmetic, each logged as val/<name>/avg@k and pass@k and scored by its own verifier,
beside the held-out val/accuracy."""
import json

import pytest

from test_end_to_end import fit, scalars


@pytest.mark.slow
def test_benchmarks_are_validated_and_logged_by_name(tmp_path, monkeypatch, shared_data):
    aime, humaneval = str(shared_data("aime2025.jsonl")), str(shared_data("humaneval.jsonl"))
    import ibpo_lit.module

    asked = []
    real = ibpo_lit.module.scoring_pool
    monkeypatch.setattr(ibpo_lit.module, "scoring_pool", lambda name, *a, **k: asked.append(name) or real(name, *a, **k))
    benchmarks = json.dumps([{"name": "aime25", "path": aime, "limit": 3},
                             {"name": "humaneval", "path": humaneval, "limit": 2, "log_name": "he"}])
    cli = fit(tmp_path, "--data.val_size", "2", "--data.val_benchmarks", benchmarks, "--data.max_prompt_tokens", "512",
              "--trainer.val_check_interval", "2", "--trainer.check_val_every_n_epoch", "null",
              "--trainer.num_sanity_val_steps", "0", "--model.val_samples", "2", steps=2)
    logged = scalars(tmp_path)
    for key in ("val/accuracy", "val/aime25/avg@2", "val/aime25/pass@2", "val/he/avg@2", "val/he/pass@2"):
        assert len(logged[key]) == 1 and 0.0 <= logged[key][0] <= 1.0, key
    assert not any("dataloader_idx" in key for key in logged)
    assert set(cli.model._val_pools) == set()  # closed at teardown
    assert "code" in asked  # HumanEval went to the sandbox, though training scores math
    # the random model solves nothing
    assert logged["val/aime25/avg@2"] == [0.0] and logged["val/he/pass@2"] == [0.0]


def test_validation_without_an_interval_runs_on_a_default_one(tmp_path, caplog):
    # The prompt stream has no end, so Lightning's default (validate at each epoch's end) never
    # validates: the command line picks every tenth of max_steps (here every step) and says so.
    with caplog.at_level("INFO"):
        cli = fit(tmp_path, "--data.val_size", "2", "--trainer.num_sanity_val_steps", "0", steps=2)
    assert cli.trainer.val_check_interval == 1 and cli.trainer.check_val_every_n_epoch is None
    assert "validating every 1 steps" in caplog.text
    assert len(scalars(tmp_path)["val/accuracy"]) == 2


def test_an_interval_given_is_kept(tmp_path):
    cli = fit(tmp_path, "--data.val_size", "2", "--trainer.num_sanity_val_steps", "0", "--trainer.val_check_interval",
              "2", "--trainer.check_val_every_n_epoch", "null", steps=2)
    assert cli.trainer.val_check_interval == 2 and len(scalars(tmp_path)["val/accuracy"]) == 1
