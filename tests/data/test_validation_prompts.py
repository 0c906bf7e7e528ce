"""Held-out validation prompts: fixed, apart from training, and read from a file when given."""
import json

import pytest

from ibpo_lit.data.arithmetic import ArithmeticConfig, arithmetic_problem
from ibpo_lit.data.datamodule import PromptDataModule
from ibpo_lit.models.tiny import build_tiny_tokenizer


def _dm(**kwargs):
    dm = PromptDataModule(**kwargs)
    dm.tokenizer_obj = build_tiny_tokenizer()
    dm.setup("fit")
    return dm


def test_arithmetic_validation_is_fixed_and_seeded_apart_from_training():
    cfg = ArithmeticConfig(min_digits=2, max_digits=3, ops=("+", "*"), seed=5)
    dm = _dm(arithmetic=cfg, val_size=6)
    first = dm.val_prompts()
    assert [p.uid for p in first] == [f"val-arithmetic:{i}" for i in range(6)]
    assert [p.prompt_ids for p in first] == [p.prompt_ids for p in dm.val_prompts()]
    held_out = [arithmetic_problem(i, ArithmeticConfig(min_digits=2, max_digits=3, ops=("+", "*"), seed=5 + 1_000_003))
                for i in range(6)]
    assert [(p.problem, p.gold) for p in first] == held_out
    training = [arithmetic_problem(i, cfg) for i in range(6)]
    assert [(p.problem, p.gold) for p in first] != training


def test_validation_off_by_default_and_from_a_file(tmp_path):
    assert _dm().val_prompts() == []
    path = tmp_path / "val.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": f"x\n#### {i}"}) for i in range(5)) + "\n")
    prompts = _dm(val_path=str(path)).val_prompts()
    assert [p.gold for p in prompts] == ["0", "1", "2", "3", "4"]
    assert [p.gold for p in _dm(val_path=str(path), val_size=2).val_prompts()] == ["0", "1"]
    with pytest.raises(FileNotFoundError, match="data.val_path"):
        PromptDataModule(val_path=str(tmp_path / "missing.jsonl"))
