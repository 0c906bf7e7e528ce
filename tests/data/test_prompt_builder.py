"""Rendering and tokenizing prompts: chat template, plain text, over-long prompt policies."""
import pytest

from ibpo_lit.data.prompt_builder import PromptBuilder, PromptTooLongError
from ibpo_lit.models.tiny import build_tiny_tokenizer

INSTRUCTION = "Answer after ####."


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()  # one token per character, ChatML template


@pytest.fixture
def plain_tok():
    t = build_tiny_tokenizer()
    t.chat_template = None
    return t


def test_chat_template_applied(tok):
    b = PromptBuilder(tok, instruction=INSTRUCTION, system_prompt="Be brief.")
    p = b.build("What is 1 + 2?", "3", "arithmetic:0")
    expected = ("<|im_start|>system\nBe brief.<|im_end|>\n"
                "<|im_start|>user\nWhat is 1 + 2?\n\nAnswer after ####.<|im_end|>\n"
                "<|im_start|>assistant\n")
    assert tok.decode(p.prompt_ids) == expected
    assert p.prompt_ids[-1] == tok.convert_tokens_to_ids("\n")  # ends with the generation prompt
    assert (p.problem, p.gold, p.uid, p.task, p.meta) == (
        "What is 1 + 2?", "3", "arithmetic:0", "math", {"instruction": INSTRUCTION, "system_prompt": "Be brief."})


def test_plain_text_without_template(plain_tok):
    p = PromptBuilder(plain_tok, instruction=INSTRUCTION, system_prompt="ignored").build("Q?", "1", "u")
    assert plain_tok.decode(p.prompt_ids) == "Q?\n\nAnswer after ####."


def test_empty_instruction(plain_tok):
    p = PromptBuilder(plain_tok, instruction="").build("Q?", "1", "u")
    assert plain_tok.decode(p.prompt_ids) == "Q?"


# With the character tokenizer and no template, "x" * n + "\n\nI" is n + 3 tokens.
def test_long_prompt_skip(plain_tok):
    b = PromptBuilder(plain_tok, instruction="I", max_prompt_tokens=10, on_long_prompt="skip")
    assert b.build("x" * 7, "1", "ok") is not None  # exactly 10 tokens
    assert b.build("x" * 8, "1", "long") is None
    assert b.stats == {"skipped_long_prompts": 1, "truncated_prompts": 0}


def test_long_prompt_error(plain_tok):
    b = PromptBuilder(plain_tok, instruction="I", max_prompt_tokens=10, on_long_prompt="error")
    with pytest.raises(PromptTooLongError, match="prompt f.jsonl:3 has 11 tokens > max_prompt_tokens=10"):
        b.build("x" * 8, "1", "f.jsonl:3")


def test_long_prompt_truncate_keeps_template(tok):
    b = PromptBuilder(tok, instruction="I", max_prompt_tokens=60, on_long_prompt="truncate")
    full = b.build("abcdefghij" * 10, "1", "u")
    assert full is not None and len(full.prompt_ids) == 60
    text = tok.decode(full.prompt_ids)
    assert text.endswith("\n\nI<|im_end|>\n<|im_start|>assistant\n")
    # template tokens: <|im_start|> + "user\n" (5) + "\n\nI" (3) + <|im_end|> + "\n" + <|im_start|>
    # + "assistant\n" (10) = 22, so 60 - 22 = 38 characters of the problem remain
    assert full.problem == ("abcdefghij" * 10)[:38]
    assert f"user\n{full.problem}\n\nI" in text
    assert full.meta == {"truncated": True, "instruction": "I", "system_prompt": None}
    assert b.stats == {"skipped_long_prompts": 0, "truncated_prompts": 1}


def test_truncate_impossible_when_template_alone_is_too_long(tok):
    b = PromptBuilder(tok, instruction="a long instruction", max_prompt_tokens=20, on_long_prompt="truncate")
    with pytest.raises(PromptTooLongError, match="template and instruction alone"):
        b.build("problem", "1", "u")


def test_bad_policy(tok):
    with pytest.raises(ValueError, match="on_long_prompt"):
        PromptBuilder(tok, on_long_prompt="drop")
