"""Training data from any file or dataset: JSON, Parquet, Arrow, saved datasets and `datasets`
names, field mapping, record columns reaching `Prompt.columns`, bad rows, chat template options,
and exact resume on a Parquet source. Every file is written by the test."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pandas as pd
import pytest

from ibpo_lit.data import Prompt, PromptDataModule
from ibpo_lit.data.records import BadRecordError, RecordFormat
from ibpo_lit.data.tables import infer_source, load_table_records
from ibpo_lit.models.tiny import build_tiny_tokenizer

ROWS = [{"question": f"Question {i}?", "answer": f"work\n#### {i},000", "level": i % 3, "tags": ["a", str(i)]}
        for i in range(5)]


def make_dm(**kwargs) -> PromptDataModule:
    dm = PromptDataModule(**kwargs)
    dm.tokenizer_obj = build_tiny_tokenizer()
    dm.setup("fit")
    return dm


def take(dm: PromptDataModule, n_batches: int) -> list[list[Prompt]]:
    it = iter(dm.train_dataloader())
    return [next(it) for _ in range(n_batches)]


def flat(batches) -> list[Prompt]:
    return [p for b in batches for p in b]


def write_parquet(path: Path, rows=ROWS) -> Path:
    pd.DataFrame(rows).to_parquet(path)
    return path


def expected_columns(i: int) -> dict:
    return {"answer": f"work\n#### {i},000", "level": i % 3, "tags": ["a", str(i)]}


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    # keep `datasets`' cache out of the home directory
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


# ------------------------------------------------------------------------------- file formats
def test_parquet_columns_reach_prompts(tmp_path):
    path = write_parquet(tmp_path / "g.parquet")
    dm = make_dm(train_path=str(path), prompts_per_step=5)
    assert dm.source == "file"
    prompts = flat(take(dm, 1))
    assert sorted(p.uid for p in prompts) == [f"g.parquet:{i}" for i in range(5)]  # 0-based rows
    for p in prompts:
        i = int(p.uid.split(":")[1])
        assert (p.problem, p.gold) == (f"Question {i}?", f"{i}000")
        assert p.columns == expected_columns(i)  # the answer raw, not the gold; no question


@pytest.mark.parametrize("layout", ["list", "lines"])
def test_json_file_list_or_lines(tmp_path, layout):
    path = tmp_path / "g.json"
    text = json.dumps(ROWS) if layout == "list" else "".join(json.dumps(r) + "\n" for r in ROWS)
    path.write_text(text)
    prompts = flat(take(make_dm(train_path=str(path), prompts_per_step=5), 1))
    assert {p.uid: p.columns for p in prompts} == {f"g.json:{i}": expected_columns(i) for i in range(5)}


def test_jsonl_columns_and_line_uids(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    prompts = flat(take(make_dm(source="jsonl", train_path=str(path), prompts_per_step=5), 1))
    assert {p.uid: p.columns for p in prompts} == {f"g.jsonl:{i + 1}": expected_columns(i) for i in range(5)}


def test_arrow_file_and_saved_dataset_dir(tmp_path):
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(saved))
    arrow = tmp_path / "g.arrow"
    shutil.copy(next(saved.glob("*.arrow")), arrow)
    for path, name in ((arrow, "g.arrow"), (saved, "saved")):
        assert infer_source(str(path)) == "file"
        prompts = flat(take(make_dm(train_path=str(path), prompts_per_step=5), 1))
        assert {p.uid: p.columns for p in prompts} == {f"{name}:{i}": expected_columns(i) for i in range(5)}


def test_saved_dataset_dict_picks_the_split(tmp_path):
    path = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:3]),
                          "test": datasets.Dataset.from_list(ROWS[3:])}).save_to_disk(str(path))
    dm = make_dm(train_path=str(path), prompts_per_step=3, val_path=str(path))
    assert sorted(p.uid for p in flat(take(dm, 1))) == ["dd/train:0", "dd/train:1", "dd/train:2"]
    assert [p.uid for p in dm.val_prompts()] == ["dd/test:0", "dd/test:1"]  # no "validation": test
    assert dm.val_prompts()[0].columns == expected_columns(3)
    with pytest.raises(ValueError, match=r"has no split 'dev' \(splits: train, test\); set data.train_split"):
        make_dm(train_path=str(path), train_split="dev")


def test_format_key_overrides_the_extension(tmp_path):
    path = write_parquet(tmp_path / "g.data")
    with pytest.raises(ValueError, match="cannot tell the format of .* set data.train_format"):
        PromptDataModule(train_path=str(path), source="file")
    prompts = flat(take(make_dm(train_path=str(path), source="file", train_format="parquet", prompts_per_step=5), 1))
    assert len(prompts) == 5 and prompts[0].uid.startswith("g.data:")


def test_field_mapping_plain_answers(tmp_path):
    rows = [{"problem": "AIME?", "answer": 204, "year": 2024}, {"problem": "Half?", "answer": "\\frac12", "year": 2023}]
    path = write_parquet(tmp_path / "m.parquet", [rows[0]])  # int column: AIME stores ints
    fmt = RecordFormat(question_key="problem", answer_format="plain")
    (r,) = load_table_records(str(path), "file", fmt)
    assert (r.problem, r.gold, r.columns) == ("AIME?", "204", {"answer": 204, "year": 2024})
    path = write_parquet(tmp_path / "s.parquet", rows[1:])
    (r,) = load_table_records(str(path), "file", fmt)
    assert (r.gold, r.columns) == ("\\frac12", {"answer": "\\frac12", "year": 2023})


# ------------------------------------------------------------------------------- datasets names
def test_dataset_source_local_directory_of_files(tmp_path):
    root = tmp_path / "mydata"
    root.mkdir()
    write_parquet(root / "train.parquet", ROWS[:4])
    write_parquet(root / "test.parquet", ROWS[4:])
    assert infer_source(str(root)) == "dataset"
    dm = make_dm(train_path=str(root), prompts_per_step=4, val_path=str(root))
    assert dm.source == "dataset"
    assert sorted(p.uid for p in flat(take(dm, 1))) == [f"{root}/train:{i}" for i in range(4)]
    assert [(p.uid, p.columns) for p in dm.val_prompts()] == [(f"{root}/test:0", expected_columns(4))]
    dm = make_dm(train_path=str(root), train_split="test", prompts_per_step=1)
    assert flat(take(dm, 1))[0].uid == f"{root}/test:0"


def test_unreachable_hub_name_fails_in_one_line(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    dm = PromptDataModule(train_path="no-such-owner/no-such-dataset", train_config="main")
    assert dm.source == "dataset"  # not a local path: a datasets name, loaded at setup
    dm.tokenizer_obj = build_tiny_tokenizer()
    with pytest.raises(ValueError) as info:
        dm.setup("fit")
    msg = str(info.value)
    assert msg.startswith("data.train_path: cannot load 'no-such-owner/no-such-dataset' (no local file")
    assert "\n" not in msg


@pytest.mark.parametrize(
    "kwargs, match, exc",
    [
        (dict(train_path="/no/such/file.parquet"), "data.train_path: no such file", FileNotFoundError),
        (dict(source="file", train_path="/no/such/dir"), "data.train_path: no such file", FileNotFoundError),
        (dict(train_path="x.parquet", train_format="csv"), "train_format must be one of", ValueError),
        (dict(source="dataset", train_path="a/b", train_format="json"), "train_format is for data.source: file",
         ValueError),
        (dict(train_split="train"), "train_split is only read when data.source is 'file' or 'dataset'", ValueError),
        (dict(val_split="test"), "only read with data.val_path", ValueError),
        (dict(val_path="/no/such/v.json"), "data.val_path: no such file", FileNotFoundError),
        (dict(chat_template_kwargs=["x"]), "chat_template_kwargs must be a mapping", ValueError),
    ],
)
def test_config_errors(kwargs, match, exc):
    with pytest.raises(exc, match=match):
        PromptDataModule(**kwargs)


def test_plain_directory_needs_source_dataset(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a saved dataset .*data.source: dataset"):
        PromptDataModule(source="file", train_path=str(tmp_path))


# ------------------------------------------------------------------------------- bad rows
def test_bad_rows_name_the_row_and_field(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[1]["question"] = None
    rows[3]["answer"] = "no marker"
    path = write_parquet(tmp_path / "g.parquet", rows)
    with pytest.raises(BadRecordError, match=r"g.parquet: row 1: field 'question': missing"):
        make_dm(train_path=str(path))
    dm = make_dm(train_path=str(path), on_bad_record="skip", prompts_per_step=3)
    assert dm.stats["skipped_records"] == 2
    assert [(e.row, e.field) for e in dm.skipped_record_errors] == [(1, "question"), (3, "answer")]
    assert "g.parquet: row 3: field 'answer': no '####'" in str(dm.skipped_record_errors[1])
    assert sorted(p.uid for p in flat(take(dm, 1))) == ["g.parquet:0", "g.parquet:2", "g.parquet:4"]


def test_missing_column_lists_the_columns(tmp_path):
    path = write_parquet(tmp_path / "m.parquet", [{"problem": "x", "solution": "#### 1"}])
    for policy in ("error", "skip"):  # a config error, whatever the bad-record policy
        with pytest.raises(BadRecordError, match=r"m.parquet: no column 'question' and 'answer' "
                                                 r"\(columns: problem, solution\); set data.question_key"):
            make_dm(train_path=str(path), on_bad_record=policy)


def test_unreadable_file_fails_in_one_line(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError) as info:
        make_dm(train_path=str(path))
    assert str(info.value).startswith("data.train_path: cannot load") and "\n" not in str(info.value)


# ------------------------------------------------------------------------------- other sources' columns
def test_arithmetic_columns_hold_the_answer():
    dm = make_dm(prompts_per_step=2, val_size=2)
    assert all(p.columns == {"answer": p.gold} for p in flat(take(dm, 1)) + dm.val_prompts())


def test_code_columns_hold_the_task_and_its_tests(tmp_path, shared_data):
    dm = make_dm(train_path=str(shared_data("mbpp_full.jsonl")), code_format="mbpp", code_split="train", task="code",
                 max_prompt_tokens=4096, prompts_per_step=1)
    (p,) = take(dm, 1)[0]
    assert p.columns["task_id"] == p.uid and p.columns["tests"] and all(isinstance(t, str) for t in p.columns["tests"])
    assert set(p.columns) <= {"task_id", "tests", "entry_point", "reference"}
    with pytest.raises(ValueError, match="code_format reads a benchmark's JSONL file; data.train_path is not one"):
        PromptDataModule(train_path=str(write_parquet(tmp_path / "c.parquet")), code_format="mbpp", task="code")


# ------------------------------------------------------------------------------- chat template options
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_chat_template_kwargs_reach_the_template():
    def first_prompt(**kwargs):
        dm = PromptDataModule(system_prompt="Be brief.", **kwargs)
        dm.tokenizer_obj = build_tiny_tokenizer()
        dm.tokenizer_obj.chat_template = THINKING_TEMPLATE
        dm.setup("fit")
        return dm, take(dm, 1)[0][0]

    dm, default = first_prompt()
    _, off = first_prompt(chat_template_kwargs={"enable_thinking": False})
    assert off.prompt_ids != default.prompt_ids
    text = dm.tokenizer_obj.decode(off.prompt_ids)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")  # the system prompt is applied
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not dm.tokenizer_obj.decode(default.prompt_ids).endswith("</think>\n\n")
    assert off.meta["chat_template_kwargs"] == {"enable_thinking": False}  # for correction prompts
    from ibpo_lit.data.correction_prompt import CorrectionPrompt

    correction = dm.tokenizer_obj.decode(CorrectionPrompt().ids(dm.tokenizer_obj, off, "4", "5"))
    assert correction.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # correction prompts too


# ------------------------------------------------------------------------------- resume
def test_parquet_resume_is_exact_with_columns(tmp_path):
    path = write_parquet(tmp_path / "g.parquet")
    kwargs = dict(train_path=str(path), prompts_per_step=2, seed=3)
    reference = [(p.uid, p.columns) for p in flat(take(make_dm(**kwargs), 7))]  # crosses 2 epoch ends

    dm = make_dm(**kwargs)
    it = iter(dm.train_dataloader())
    for _ in range(3):
        dm.mark_consumed(next(it))
    next(it)  # prefetched, never consumed
    state = dm.state_dict()
    assert (state["epoch"], state["index"]) == (1, 1)

    resumed = make_dm(**kwargs)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # a checkpoint's state is plain data
    assert [(p.uid, p.columns) for p in flat(take(resumed, 4))] == reference[6:]


def test_columns_survive_worker_processes(tmp_path):
    path = write_parquet(tmp_path / "g.parquet")
    dm = make_dm(train_path=str(path), prompts_per_step=5, num_workers=1)
    prompts = flat(take(dm, 1))
    # the batch came back pickled from a worker process
    assert {p.uid: p.columns for p in prompts} == {f"g.parquet:{i}": expected_columns(i) for i in range(5)}


# ------------------------------------------------------------------------------- command line
@pytest.mark.usefixtures("one_intra_op_thread")  # (tests/conftest.py)
def test_fit_from_the_command_line_on_parquet(tmp_path, monkeypatch):
    import sys

    from ibpo_lit.__main__ import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    rows = [{"question": "What is 1 + 2?", "answer": "1 + 2 = 3\n#### 3", "source_id": i} for i in range(4)]
    path = write_parquet(tmp_path / "g.parquet", rows)
    tiny = Path(__file__).parents[2] / "configs" / "tiny.yaml"
    cli = main(["fit", "--config", str(tiny), "--trainer.max_steps", "1", "--trainer.default_root_dir",
                str(tmp_path / "run"), "--trainer.enable_progress_bar", "false", "--data.train_path", str(path),
                "--data.chat_template_kwargs", "{enable_thinking: false}"])
    dm = cli.datamodule
    assert dm.source == "file" and dm.chat_template_kwargs == {"enable_thinking": False}
    assert dm.position.index == dm.prompts_per_step  # one step consumed from the Parquet stream


@pytest.mark.usefixtures("one_intra_op_thread")
def test_unreachable_hub_name_is_one_error_line_on_the_command_line(tmp_path, monkeypatch, capsys):
    import sys

    import huggingface_hub.constants

    from ibpo_lit.__main__ import entry_point

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    tiny = Path(__file__).parents[2] / "configs" / "tiny.yaml"
    status = entry_point(["fit", "--config", str(tiny), "--trainer.default_root_dir", str(tmp_path / "run"),
                          "--trainer.enable_progress_bar", "false", "--data.train_path", "no-such-owner/gsm8k",
                          "--data.train_config", "main"])
    assert status == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("ibpo-lit: error: data.train_path: cannot load 'no-such-owner/gsm8k' (no local file")
