"""Prompt-only data (no answer, for a reward of your own) and conversational data (TRL's
``prompt`` as a list of messages): records, rendering, the data module and the correction prompt,
each hand-derived on the character-level tiny tokenizer. The command line's one-line errors and
the end-to-end fits are in test_own_data_cli.py."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ibpo_lit.data import PromptDataModule
from ibpo_lit.data.correction_prompt import CorrectionPrompt
from ibpo_lit.tasks import CUSTOM_TASK
from ibpo_lit.data.prompt_builder import PromptBuilder
from ibpo_lit.data.records import BadRecordError, RecordFormat, conversation_text, read_records, record_from_fields
from ibpo_lit.models.tiny import build_tiny_tokenizer

SYSTEM = "<|im_start|>system\n"
USER = "<|im_start|>user\n"
ASSISTANT = "<|im_start|>assistant\n"
END = "<|im_end|>\n"


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()  # one token per character, ChatML template


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def error_of(obj: dict, fmt: RecordFormat = RecordFormat()) -> str:
    with pytest.raises(BadRecordError) as info:
        record_from_fields(obj, fmt, "f.jsonl", line=3)
    return str(info.value)


# ------------------------------------------------------------------ records without an answer
def test_a_record_without_an_answer_has_no_gold_when_no_verifier_needs_one():
    own = RecordFormat("prompt", answer_required=False)
    r = record_from_fields({"prompt": " Write a haiku ", "topic": "sea"}, own, "f.jsonl", line=1)
    assert (r.problem, r.gold, r.uid, r.columns, r.messages) == ("Write a haiku", None, "f.jsonl:1", {"topic": "sea"},
                                                                 None)
    # an answer that is there is still read (and checked) as the format says
    r = record_from_fields({"prompt": "x", "answer": "so #### 1,000"}, own, "f.jsonl", line=2)
    assert (r.gold, r.columns) == ("1000", {"answer": "so #### 1,000"})
    # answer_key None: no answer is read at all, the field stays a column
    none = RecordFormat("prompt", None, answer_required=False)
    r = record_from_fields({"prompt": "x", "answer": [1, 2]}, none, "f.jsonl", line=3)
    assert (r.gold, r.columns) == (None, {"answer": [1, 2]})
    with pytest.raises(ValueError, match="answer_key=None .* needs answer_required=False"):
        RecordFormat(answer_key=None)


def test_a_missing_answer_says_why_and_what_to_do():
    assert error_of({"question": "Write a haiku"}) == (
        "f.jsonl:3: field 'answer': missing (the record has fields [question]; the built-in verifiers (math, code) "
        "score each response against it: set data.answer_key to the field that holds the answer, or score with a "
        "reward function of your own (model.reward: package.module:function), which needs none)")
    # the evaluate command's options instead of training's keys
    assert error_of({"question": "x"}, RecordFormat(settings="--")) == (
        "f.jsonl:3: field 'answer': missing (the record has fields [question]; the math verifier scores each "
        "response against it: set --answer_key to the field that holds the answer)")


def test_a_missing_question_names_the_field_that_looks_like_it():
    assert error_of({"prompt": "Write a haiku", "topic": "sea"}) == (
        "f.jsonl:3: field 'question': missing (the record has fields [prompt, topic]: set data.question_key: prompt)")
    assert error_of({"problem": "1+1?", "answer": "2"}, RecordFormat(settings="--")) == (
        "f.jsonl:3: field 'question': missing (the record has fields [problem, answer]: set --question_key problem)")
    # nothing that looks like a question: the plain message (the record simply lacks it)
    assert error_of({"answer": "#### 3"}) == "f.jsonl:3: field 'question': missing"


def test_answers_that_are_final_answers_point_at_answer_format_plain():
    assert error_of({"question": "x", "answer": "72"}) == (
        "f.jsonl:3: field 'answer': no '####' before the final answer (if this field holds the final answer "
        "itself, as in MATH-500 or AIME, set data.answer_format: plain)")
    assert error_of({"question": "x", "answer": 72}) == (
        "f.jsonl:3: field 'answer': expected a string, got int (an integer is the final answer itself, as in "
        "AIME: set data.answer_format: plain)")
    assert error_of({"question": "x", "answer": "72"}, RecordFormat(settings="--")).endswith(
        "set --answer_format plain)")


# ------------------------------------------------------------------ conversations
def test_conversations_are_read_checked_and_given_a_text_form():
    msgs = [{"role": "system", "content": "Be brief.", "name": None}, {"role": "user", "content": "What is 1 + 1?"}]
    r = record_from_fields({"question": msgs, "answer": "#### 2"}, RecordFormat(), "f.jsonl", line=1)
    # other message keys (a table's None-filled struct fields) are not passed to the template
    assert r.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 1?"}]
    assert (r.problem, r.gold, r.columns) == ("What is 1 + 1?", "2", {"answer": "#### 2"})
    turns = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"},
             {"role": "user", "content": "Times 3? "}]
    assert conversation_text(turns) == "User: 1 + 1?\n\nAssistant: 2\n\nUser: Times 3?"


@pytest.mark.parametrize("question, reason", [
    ([], "empty list of messages"),
    (["hi"], "message 1: expected an object with 'role' and 'content', got str"),
    ([{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}],
     "message 2: 'role' must be one of 'system', 'user', 'assistant', got 'bot'"),
    ([{"content": "a"}], "message 1: 'role' must be one of 'system', 'user', 'assistant', got None"),
    ([{"role": "user", "content": ["a"]}], "message 1 (user): 'content' must be a string, got list"),
    ([{"role": "user", "content": "  "}], "message 1 (user): empty content"),
    ([{"role": "system", "content": "Be brief."}], "no message with role 'user'"),
    (7, "expected a string or a list of messages, got int"),
])
def test_a_bad_conversation_names_file_line_field_and_message(question, reason):
    assert error_of({"question": question, "answer": "#### 1"}) == f"f.jsonl:3: field 'question': {reason}"


def test_a_parquet_table_of_conversations(tmp_path):
    # datasets returns a list-of-structs column as a list of dicts, every struct key present
    rows = [{"prompt": [{"role": "user", "content": f"Q{i}?"}], "answer": str(i)} for i in range(3)]
    path = tmp_path / "c.parquet"
    pd.DataFrame(rows).to_parquet(path)
    from ibpo_lit.data.tables import load_table_records

    records = list(load_table_records(str(path), "file", RecordFormat("prompt", answer_format="plain")))
    assert [(r.problem, r.gold, r.messages) for r in records] == [
        (f"Q{i}?", str(i), [{"role": "user", "content": f"Q{i}?"}]) for i in range(3)]
    with pytest.raises(BadRecordError, match=r"c.parquet: no column 'question' \(columns: prompt, answer\); "
                                             r"set data.question_key: prompt$"):
        list(load_table_records(str(path), "file", RecordFormat(answer_format="plain")))


# ------------------------------------------------------------------ rendering
def test_a_conversation_is_rendered_as_given_plus_the_instruction(tok):
    b = PromptBuilder(tok, instruction="Answer after ####.", system_prompt="Data's system.")
    msgs = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"},
            {"role": "user", "content": "Times 3?"}]
    p = b.build(conversation_text(msgs), "6", "u", messages=msgs)
    # no system message of its own: data.system_prompt first; the instruction ends the last user turn
    assert tok.decode(p.prompt_ids) == (
        f"{SYSTEM}Data's system.{END}{USER}1 + 1?{END}{ASSISTANT}2{END}"
        f"{USER}Times 3?\n\nAnswer after ####.{END}{ASSISTANT}")
    assert p.problem == "User: 1 + 1?\n\nAssistant: 2\n\nUser: Times 3?"
    assert p.meta == {"instruction": "Answer after ####.", "system_prompt": "Data's system."}
    assert msgs[-1]["content"] == "Times 3?"  # the record's messages are not changed

    own = [{"role": "system", "content": "Its own."}, {"role": "user", "content": "Hi?"}]
    p = b.build("Hi?", None, "u", messages=own)
    assert tok.decode(p.prompt_ids) == f"{SYSTEM}Its own.{END}{USER}Hi?\n\nAnswer after ####.{END}{ASSISTANT}"
    assert p.meta["system_prompt"] == "Its own." and p.gold is None


def test_a_final_assistant_message_is_continued(tok):
    msgs = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "The answer is"}]
    p = PromptBuilder(tok, instruction="").build(conversation_text(msgs), "2", "u", messages=msgs)
    assert tok.decode(p.prompt_ids) == f"{USER}1 + 1?{END}{ASSISTANT}The answer is"


def test_a_conversation_without_a_chat_template_is_its_text_form(tok):
    plain = build_tiny_tokenizer()
    plain.chat_template = None
    msgs = [{"role": "system", "content": "S."}, {"role": "user", "content": "1 + 1?"}]
    p = PromptBuilder(plain, instruction="I.", system_prompt="ignored").build("1 + 1?", "2", "u", messages=msgs)
    assert plain.decode(p.prompt_ids) == "1 + 1?\n\nI."


def test_truncating_a_conversation_cuts_its_last_user_message(tok):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
            {"role": "user", "content": "x" * 50}]
    # everything but the x's, one token per character and per special token: "<s>user\nHi<e>\n" 10,
    # "<s>assistant\nYo<e>\n" 15, "<s>user\n" + "\n\nI<e>\n" 11, "<s>assistant\n" 11: 47, so 60 keeps 13
    b = PromptBuilder(tok, instruction="I", max_prompt_tokens=60, on_long_prompt="truncate")
    p = b.build(conversation_text(msgs), "1", "u", messages=msgs)
    assert len(p.prompt_ids) == 60 and p.meta["truncated"] is True
    assert tok.decode(p.prompt_ids) == f"{USER}Hi{END}{ASSISTANT}Yo{END}{USER}{'x' * 13}\n\nI{END}{ASSISTANT}"
    assert p.problem == f"User: Hi\n\nAssistant: Yo\n\nUser: {'x' * 13}"
    assert msgs[-1]["content"] == "x" * 50


# ------------------------------------------------------------------ the data module
def test_prompt_only_data_for_a_reward_of_your_own(tmp_path, tok):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Write a haiku", "topic": "sea"},
                                             {"prompt": "Write a limerick", "topic": "cat"}])
    dm = PromptDataModule(train_path=str(data), question_key="prompt", instruction="", task=CUSTOM_TASK)
    dm.tokenizer_obj = tok
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert sorted((p.problem, p.gold, p.task, p.columns["topic"]) for p in batch) == [
        ("Write a haiku", None, CUSTOM_TASK, "sea"), ("Write a limerick", None, CUSTOM_TASK, "cat")]
    # the built-in verifiers still need the answer
    dm = PromptDataModule(train_path=str(data), question_key="prompt")
    dm.tokenizer_obj = tok
    with pytest.raises(BadRecordError, match=r"p.jsonl:1: field 'answer': missing \(the record has fields "
                                             r"\[prompt, topic\]; the built-in verifiers"):
        dm.setup("fit")


def test_answer_key_null_is_for_rewards_of_your_own(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Write a haiku", "answer": ["a", "list"]}])
    PromptDataModule(train_path=str(data), question_key="prompt", answer_key=None, task=CUSTOM_TASK)
    with pytest.raises(ValueError) as info:
        PromptDataModule(train_path=str(data), question_key="prompt", answer_key=None)
    assert str(info.value) == (
        "data.answer_key: null (records without an answer) leaves the 'math' verifier nothing to score responses "
        "against: set data.answer_key to the field with the answer, or score with a reward function of your own "
        "(model.reward: package.module:function)")


def test_conversational_jsonl_through_the_data_module(tmp_path, tok):
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}],
             "answer": "4"}]
    data = write_jsonl(tmp_path / "c.jsonl", rows)
    dm = PromptDataModule(train_path=str(data), question_key="prompt", answer_format="plain", instruction="I.",
                          system_prompt="Unused: the conversation has its own.", prompts_per_step=1,
                          val_path=str(data))
    dm.tokenizer_obj = tok
    dm.setup("fit")
    [train] = next(iter(dm.train_dataloader()))
    [val] = dm.val_prompts()
    for p in (train, val):
        assert tok.decode(p.prompt_ids) == f"{SYSTEM}Be brief.{END}{USER}2 + 2?\n\nI.{END}{ASSISTANT}"
        assert (p.problem, p.gold, p.columns) == ("2 + 2?", "4", {"answer": "4"})


def test_the_correction_prompt_of_a_conversation(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 1?"},
            {"role": "assistant", "content": "2"}, {"role": "user", "content": "Times 3?"}]
    prompt = PromptBuilder(tok, instruction="End with ####.").build(conversation_text(msgs), "6", "u", messages=msgs)
    text = tok.decode(CorrectionPrompt(template="Compare.").ids(tok, prompt, "It is 5", "It is 6"))
    # the conversation's own system message, the turns as the problem, the data's instruction
    assert text == (f"{SYSTEM}Be brief.{END}{USER}Compare.\n\nProblem:\nUser: 1 + 1?\n\nAssistant: 2\n\n"
                    f"User: Times 3?\n\nCandidate solution 1:\nIt is 5\n\nCandidate solution 2:\nIt is 6\n\n"
                    f"End with ####.{END}{ASSISTANT}")


def test_read_records_keeps_the_messages(tmp_path):
    data = write_jsonl(tmp_path / "c.jsonl", [{"q": [{"role": "user", "content": "Hi?"}], "a": "1"}])
    [r] = read_records(data, RecordFormat("q", "a", "plain"))
    assert (r.uid, r.problem, r.messages) == ("c.jsonl:1", "Hi?", [{"role": "user", "content": "Hi?"}])


def test_a_parquet_table_without_an_answer_column(tmp_path):
    from ibpo_lit.data.tables import load_table_records

    path = tmp_path / "p.parquet"
    pd.DataFrame([{"prompt": "Write a haiku", "topic": "sea"}]).to_parquet(path)
    [r] = load_table_records(str(path), "file", RecordFormat("prompt", answer_required=False))
    assert (r.uid, r.problem, r.gold, r.columns) == ("p.parquet:0", "Write a haiku", None, {"topic": "sea"})
    with pytest.raises(BadRecordError) as info:
        list(load_table_records(str(path), "file", RecordFormat("prompt")))
    assert str(info.value) == (
        "p.parquet: no column 'answer' (columns: prompt, topic); the built-in verifiers (math, code) score each "
        "response against it: set data.answer_key to the field that holds the answer, or score with a reward "
        "function of your own (model.reward: package.module:function), which needs none")
