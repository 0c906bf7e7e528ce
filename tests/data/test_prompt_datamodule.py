"""PromptDataModule: config validation, batches, shuffling, counters and exact resume."""
import json
from pathlib import Path

import lightning as L
import pytest
import torch

from ibpo_lit.data import ArithmeticConfig, Prompt, PromptDataModule, arithmetic_problem
from ibpo_lit.models.tiny import build_tiny_tokenizer


def write_gsm8k(path: Path, n: int, bad_lines: dict[int, str] | None = None) -> Path:
    lines = [json.dumps({"question": f"Question {i}?", "answer": f"work\n#### {i},000"}) for i in range(n)]
    for line_no, text in (bad_lines or {}).items():
        lines.insert(line_no - 1, text)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_dm(**kwargs) -> PromptDataModule:
    dm = PromptDataModule(**kwargs)
    dm.tokenizer_obj = build_tiny_tokenizer()
    dm.setup("fit")
    return dm


def take(dm: PromptDataModule, n_batches: int) -> list[list[Prompt]]:
    it = iter(dm.train_dataloader())
    return [next(it) for _ in range(n_batches)]


def uids(batches) -> list[str]:
    return [p.uid for b in batches for p in b]


def test_arithmetic_batches():
    cfg = ArithmeticConfig(max_digits=1, seed=5)
    batches = take(make_dm(arithmetic=cfg, prompts_per_step=3), 2)
    assert [len(b) for b in batches] == [3, 3]
    flat = [p for b in batches for p in b]
    assert [p.uid for p in flat] == [f"arithmetic:{i}" for i in range(6)]
    assert [(p.problem, p.gold) for p in flat] == [arithmetic_problem(i, cfg) for i in range(6)]
    assert all(isinstance(p.prompt_ids, list) and p.task == "math" for p in flat)


def test_chat_template_and_instruction():
    dm = make_dm(system_prompt="Sys.", instruction="Go.")
    p = take(dm, 1)[0][0]
    assert dm.tokenizer_obj.decode(p.prompt_ids) == (
        f"<|im_start|>system\nSys.<|im_end|>\n<|im_start|>user\n{p.problem}\n\nGo.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tokenizer_loaded_by_name():
    dm = PromptDataModule(tokenizer="tiny-llama")
    dm.setup("fit")
    assert dm.tokenizer_obj.chat_template


def test_jsonl_epochs_are_shuffled_per_seed(tmp_path):
    path = write_gsm8k(tmp_path / "g.jsonl", 6)
    a = uids(take(make_dm(source="jsonl", train_path=str(path), seed=0), 6))  # two epochs
    again = uids(take(make_dm(source="jsonl", train_path=str(path), seed=0), 6))
    other = uids(take(make_dm(source="jsonl", train_path=str(path), seed=1), 3))
    assert a == again
    every = {f"g.jsonl:{i}" for i in range(1, 7)}
    assert set(a[:6]) == every and set(a[6:]) == every  # each epoch is a permutation
    assert a[:6] != a[6:]
    # epoch e is shuffled with seed * 1000003 + e: seed 1 is not seed 0 shifted by an epoch
    # (with seed + e, seed 1's first epoch was seed 0's second)
    assert a[6:] != other
    assert a[:6] != sorted(a[:6], key=lambda u: int(u.split(":")[1]))


def test_jsonl_golds_drop_thousands_separators(tmp_path):
    path = write_gsm8k(tmp_path / "g.jsonl", 3)
    prompts = [p for b in take(make_dm(source="jsonl", train_path=str(path)), 2) for p in b]
    assert {p.problem: p.gold for p in prompts[:3]} == {f"Question {i}?": f"{i}000" for i in range(3)}


def test_bad_records_error_or_skip_counted(tmp_path):
    path = write_gsm8k(tmp_path / "g.jsonl", 4, bad_lines={2: "{oops", 4: json.dumps({"question": "q"})})
    with pytest.raises(ValueError, match=r"g.jsonl:2: malformed JSON"):
        make_dm(source="jsonl", train_path=str(path))
    dm = make_dm(source="jsonl", train_path=str(path), on_bad_record="skip")
    assert dm.stats["skipped_records"] == 2
    assert set(uids(take(dm, 2))) == {"g.jsonl:1", "g.jsonl:3", "g.jsonl:5", "g.jsonl:6"}


def test_long_prompts_skipped_and_counted(tmp_path):
    path = tmp_path / "g.jsonl"
    lengths = [5, 400, 5, 5]  # question lengths; one is far over the limit
    path.write_text("".join(json.dumps({"question": "q" * n, "answer": "#### 1"}) + "\n" for n in lengths))
    dm = make_dm(source="jsonl", train_path=str(path), max_prompt_tokens=100, prompts_per_step=3)
    first = take(dm, 1)[0]
    assert "g.jsonl:2" not in [p.uid for p in first]
    assert dm.stats == {"skipped_records": 0, "skipped_long_prompts": 1, "truncated_prompts": 0}


def test_every_prompt_too_long_fails_instead_of_spinning():
    dm = make_dm(max_prompt_tokens=5)
    with pytest.raises(ValueError, match="in a row exceed max_prompt_tokens=5"):
        take(dm, 1)


def test_state_dict_round_trip_resumes_the_same_stream(tmp_path):
    path = write_gsm8k(tmp_path / "g.jsonl", 5)
    kwargs = dict(source="jsonl", train_path=str(path), prompts_per_step=2, seed=3)
    reference = uids(take(make_dm(**kwargs), 8))  # 16 prompts: crosses 3 epoch boundaries

    dm = make_dm(**kwargs)
    it = iter(dm.train_dataloader())
    for _ in range(3):
        dm.mark_consumed(next(it))
    next(it)  # prefetched but never consumed: must be served again after resume
    state = dm.state_dict()
    assert (state["epoch"], state["index"]) == (1, 1)  # 6 prompts = 5 (epoch 0) + 1

    resumed = make_dm(**kwargs)
    resumed.load_state_dict(state)
    assert uids(take(resumed, 5)) == reference[6:]

    # a fresh iterator of the same DataModule also continues after the consumed batches
    assert uids(take(dm, 5)) == reference[6:]


def test_load_state_dict_before_setup():
    dm = PromptDataModule()
    dm.load_state_dict({"epoch": 0, "index": 7, "stats": {"skipped_long_prompts": 2}})
    dm.tokenizer_obj = build_tiny_tokenizer()
    dm.setup("fit")
    assert take(dm, 1)[0][0].uid == "arithmetic:7"
    assert dm.stats["skipped_long_prompts"] == 2


class _Recorder(L.LightningModule):
    """Records the uids each training step sees; one dummy parameter to optimise."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[str] = []

    def training_step(self, batch, batch_idx):
        self.seen += [p.uid for p in batch]
        return (self.w**2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path, max_steps, ckpt_path=None):
    dm = PromptDataModule(prompts_per_step=2)
    dm.tokenizer_obj = build_tiny_tokenizer()
    model = _Recorder()
    trainer = L.Trainer(max_steps=max_steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return trainer, dm, model


def test_lightning_checkpoint_resume_is_exact(tmp_path):
    _, _, straight = _fit(tmp_path, 5)
    trainer, dm, first = _fit(tmp_path, 3)
    # Lightning prefetches a batch ahead; the state counts only what training steps consumed
    assert dm.state_dict()["index"] == 6
    ckpt = tmp_path / "step3.ckpt"
    trainer.save_checkpoint(ckpt)
    _, _, second = _fit(tmp_path, 5, ckpt_path=str(ckpt))
    assert first.seen + second.seen == straight.seen == [f"arithmetic:{i}" for i in range(10)]


@pytest.mark.parametrize(
    "kwargs, match, exc",
    [
        (dict(source="hf"), "source must be one of", ValueError),
        (dict(source="jsonl"), "train_path is required", ValueError),
        (dict(source="jsonl", train_path="/no/such/file.jsonl"), "train_path: no such file", FileNotFoundError),
        (dict(source="arithmetic", train_path="x.jsonl"), "train_path is only read when data.source is .file. or .dataset.", ValueError),
        (dict(train_path="/no/such/file.jsonl"), "train_path: no such file", FileNotFoundError),  # source inferred
        (dict(answer_format="latex"), "answer_format must be one of", ValueError),
        (dict(on_bad_record="warn"), "on_bad_record must be one of", ValueError),
        (dict(on_long_prompt="drop"), "on_long_prompt must be one of", ValueError),
        (dict(prompts_per_step=0), "prompts_per_step must be >= 1", ValueError),
        (dict(max_prompt_tokens=0), "max_prompt_tokens must be >= 1", ValueError),
        (dict(num_workers=-1), "num_workers must be >= 0", ValueError),
        (dict(task="chess"), "unknown task 'chess'", ValueError),
        (dict(question_key=""), "question_key", ValueError),
    ],
)
def test_init_validates(kwargs, match, exc):
    with pytest.raises(exc, match=match):
        PromptDataModule(**kwargs)


def test_train_data_needs_setup():
    with pytest.raises(RuntimeError, match="setup"):
        PromptDataModule().train_dataloader()
