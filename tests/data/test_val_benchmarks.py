"""`data.val_benchmarks`: evaluation benchmarks as validation sets (the data side)."""
import pytest

from ibpo_lit.data.prompt_builder import PromptBuilder
from ibpo_lit.data.val_benchmarks import ValBenchmark, benchmark_prompts, check_unique_names
from ibpo_lit.models.tiny import build_tiny_tokenizer


def test_prompts_carry_their_set_task_and_instruction(shared_data):
    builder = PromptBuilder(build_tiny_tokenizer(), instruction="TRAINING INSTRUCTION", max_prompt_tokens=4096)
    aime_path, humaneval_path = str(shared_data("aime2025.jsonl")), str(shared_data("humaneval.jsonl"))
    aime = benchmark_prompts(ValBenchmark("aime25", path=aime_path, limit=5), builder)
    assert len(aime) == 5 and {p.meta["val_set"] for p in aime} == {"aime25"}
    assert {p.task for p in aime} == {"math"} and aime[0].gold == "70"
    assert "####" in builder.tokenizer.decode(aime[0].prompt_ids)  # the math instruction, not training's
    assert "TRAINING INSTRUCTION" not in builder.tokenizer.decode(aime[0].prompt_ids)
    code = benchmark_prompts(ValBenchmark("humaneval", path=humaneval_path, limit=2, log_name="he"), builder)
    assert {p.task for p in code} == {"code"} and {p.meta["val_set"] for p in code} == {"he"}
    assert code[0].uid.startswith("he:")


def test_prompts_too_long_are_skipped_and_counted_never_truncated(shared_data):
    builder = PromptBuilder(build_tiny_tokenizer(), max_prompt_tokens=300, on_long_prompt="truncate")
    prompts = benchmark_prompts(ValBenchmark("aime25", path=str(shared_data("aime2025.jsonl"))), builder)
    assert 0 < len(prompts) < 30
    assert builder.stats["skipped_long_prompts"] == 30 - len(prompts)
    assert not any(p.meta.get("truncated") for p in prompts)


def test_bad_specs_fail_with_the_field_named(tmp_path):
    with pytest.raises(ValueError, match="gsm9k"):
        ValBenchmark("gsm9k")
    with pytest.raises(FileNotFoundError, match="data.val_benchmarks: aime25: no such file"):
        ValBenchmark("aime25", path=str(tmp_path / "none.jsonl"))
    with pytest.raises(ValueError, match="limit must be >= 1"):
        ValBenchmark("aime25", limit=0)
    with pytest.raises(ValueError, match="distinct log_name"):
        check_unique_names([ValBenchmark("aime25"), ValBenchmark("aime25")])
