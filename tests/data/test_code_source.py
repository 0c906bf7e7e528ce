"""PromptDataModule on a code benchmark: MBPP records become prompts whose gold is the
sandbox's test spec, and a tiny-model step scores them with the code reward."""
import os
import sys

import pytest

from ibpo_lit.data.datamodule import PromptDataModule
from ibpo_lit.models import build_tiny_tokenizer
from ibpo_lit.rewards import get_reward

@pytest.fixture
def mbpp(shared_data):
    return str(shared_data("mbpp_full.jsonl"))


def test_mbpp_source_gives_code_prompts_with_sandbox_gold(mbpp):
    dm = PromptDataModule(train_path=mbpp, code_format="mbpp", code_split="train", code_shown_tests=1,
                          task="code", val_path=mbpp, code_val_split="validation", max_prompt_tokens=4096)
    dm.tokenizer_obj = build_tiny_tokenizer()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert len(batch) == 2 and all(p.task == "code" for p in batch)
    assert all(p.uid.startswith("mbpp/") and 601 <= int(p.uid.split("/")[1]) <= 974 for p in batch)
    reward = get_reward("code")
    # the gold is the test spec: a wrong program scores 0
    assert reward("def nothing():\n    pass\n", batch[0].gold) == 0.0
    val = dm.val_prompts()
    assert len(val) == 90 and all(511 <= int(p.uid.split("/")[1]) <= 600 for p in val)


def test_code_format_needs_the_code_task(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text("{}\n")
    with pytest.raises(ValueError, match="needs the code verifier: model.reward: code"):
        PromptDataModule(train_path=str(path), code_format="mbpp")
    with pytest.raises(ValueError, match="code_format"):
        PromptDataModule(train_path=str(path), code_format="apps", task="code")


@pytest.mark.slow
def test_tiny_fit_on_mbpp_with_the_sandbox(tmp_path, monkeypatch, mbpp):
    from ibpo_lit.__main__ import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    cli = main(["fit", "--config", os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml"),
                "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path),
                "--trainer.enable_progress_bar", "false", "--data.train_path", mbpp, "--data.code_format", "mbpp",
                "--data.max_prompt_tokens", "4096", "--model.reward", "code",
                "--model.reward_timeout_s", "30"])
    metrics = cli.trainer.logged_metrics
    assert float(metrics["train/reward"]) == 0.0  # a random model writes no working code
    assert float(metrics["train/unscorable"]) == 0.0  # ... but every program was judged


def test_the_data_task_follows_model_reward(tmp_path, monkeypatch):
    # One setting: `model.reward` decides which verifier scores the prompts and how they are built.
    from ibpo_lit.__main__ import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    base = ["--config", os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml"),
            "--trainer.default_root_dir", str(tmp_path)]
    cli = main([*base, "--model.reward", "code"], run=False)
    assert cli.datamodule.task == "code" and cli.model.reward_name == "code"
    assert main(base, run=False).datamodule.task == "math"
    from ibpo_lit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data.task is not set on its own: it follows model.reward, model.rewards"):
        main([*base, "--data.task", "code"], run=False)
