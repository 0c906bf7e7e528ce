"""``python -m ibpo_lit evaluate`` on your own data: field mapping, conversations and chat template
options end to end on the tiny model; each mistake is one line, before any model loads (vLLM
missing included)."""
from __future__ import annotations

import json
import sys

import pytest

from ibpo_lit.__main__ import entry_point
from ibpo_lit.evaluation import runner
from ibpo_lit.evaluation.runner import record_format
from ibpo_lit.models.tiny import CHATML_TEMPLATE

ROWS = [
    {"problem": "What is 2 + 3?", "answer": "5", "level": 1},
    {"problem": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 7 * 6?"}],
     "answer": 42},
]
# ChatML that shows Qwen3's enable_thinking=False the way Qwen3's template does (an empty think block).
THINKING_TEMPLATE = CHATML_TEMPLATE.replace(
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think></think>' }}{% endif %}{% endif %}")


@pytest.fixture
def own_path(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def _args(*extra: str) -> list[str]:
    return ["evaluate", "--model_name_or_path", "tiny-llama", "--k", "2", "--max_new_tokens", "4", *extra]


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the error was reported")

    monkeypatch.setattr(runner, "load_model", refuse)
    monkeypatch.delenv("IBPO_LIT_DEBUG", raising=False)


def _one_line_error(capsys, args: list[str]) -> str:
    assert entry_point(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    return err[-1]


def test_your_own_data_end_to_end(own_path, tmp_path, monkeypatch, capsys):
    """Key mapping, a conversation and chat_template_kwargs, through the command line."""
    real_load, real_sample, seen = runner.load_model, runner.sample, {}

    def load_with_a_thinking_template(*args, **kwargs):
        model, tokenizer = real_load(*args, **kwargs)
        tokenizer.chat_template = THINKING_TEMPLATE
        seen["tokenizer"] = tokenizer
        return model, tokenizer

    def spy_sample(engine, tokenizer, prompts, *args, **kwargs):
        seen["prompts"] = [tokenizer.decode(p.prompt_ids) for p in prompts]
        return real_sample(engine, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(runner, "load_model", load_with_a_thinking_template)
    monkeypatch.setattr(runner, "sample", spy_sample)
    out = tmp_path / "mine.json"
    assert entry_point(_args("--benchmark", "mine", "--path", own_path, "--question_key", "problem",
                             "--answer_format", "plain", "--instruction", "I.",
                             "--chat_template_kwargs", '{"enable_thinking": false}', "--output", str(out))) == 0
    result = json.loads(out.read_text())
    assert (result["benchmark"], result["task"], result["n_problems"], result["k"]) == ("mine", "math", 2, 2)
    assert result["record_format"] == {"question_key": "problem", "answer_key": "answer", "answer_format": "plain"}
    assert result["chat_template_kwargs"] == {"enable_thinking": False}
    assert [(p["uid"], p["gold"], len(p["scores"])) for p in result["problems"]] == [
        ("mine.jsonl:1", "5", 2), ("mine.jsonl:2", "42", 2)]
    assert seen["prompts"] == [
        "<|im_start|>user\nWhat is 2 + 3?\n\nI.<|im_end|>\n<|im_start|>assistant\n<think></think>",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 7 * 6?\n\nI.<|im_end|>\n"
        "<|im_start|>assistant\n<think></think>"]
    assert "| mine | tiny-llama | 2 |" in capsys.readouterr().out


def test_your_own_data_mistakes_are_one_line(own_path, capsys, no_model):
    assert _one_line_error(capsys, _args("--benchmark", "mine", "--path", own_path)) == (
        f"ibpo-lit: error: {own_path}:1: field 'question': missing (the record has fields [problem, answer, level]: "
        "set --question_key problem)")
    assert _one_line_error(capsys, _args("--benchmark", "mine", "--path", own_path, "--question_key", "problem")) == (
        f"ibpo-lit: error: {own_path}:1: field 'answer': no '####' before the final answer (if this field holds the "
        "final answer itself, as in MATH-500 or AIME, set --answer_format plain)")
    # a benchmark's own format, read from a file in another: the same hint
    assert _one_line_error(capsys, _args("--benchmark", "gsm8k", "--path", own_path, "--question_key", "problem")) \
        .endswith("set --answer_format plain)")
    assert _one_line_error(capsys, _args("--benchmark", "mine")) == (
        "ibpo-lit: error: unknown benchmark 'mine'; valid names: ['aime25', 'gsm8k', 'gsm8k_train', 'hmmt25', "
        "'humaneval', 'livecodebench', 'math500', 'mbpp', 'mbpp_sanitized']; to evaluate your own data, give it a "
        "name and pass --path (a JSONL, JSON, Parquet or Arrow file, or a datasets name) with --question_key, "
        "--answer_key, --answer_format as needed: it is scored by the math verifier")
    assert _one_line_error(capsys, _args("--benchmark", "mine", "--path", "no/such.parquet")) == (
        "ibpo-lit: error: --path: no such file: no/such.parquet")
    assert _one_line_error(capsys, _args("--benchmark", "mbpp", "--question_key", "text")) == (
        "ibpo-lit: error: --question_key: 'mbpp' is read in its upstream format; these options apply to math "
        "benchmarks and your own data")


def test_record_format_of_each_kind_of_benchmark():
    assert record_format("humaneval") is None
    math500 = record_format("math500")
    assert (math500.question_key, math500.answer_key, math500.answer_format, math500.settings) == (
        "problem", "answer", "plain", "--")
    mine = record_format("mine", answer_key="solution")
    assert (mine.question_key, mine.answer_key, mine.answer_format) == ("question", "solution", "gsm8k")


def test_backend_vllm_without_vllm_fails_before_anything_loads(capsys, monkeypatch, no_model):
    from ibpo_lit.rollout.vllm_engine import vllm_install_hint

    monkeypatch.setattr(runner, "load_problems", lambda *a, **k: pytest.fail("data was read before the error"))
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises, as without the package
    line = _one_line_error(capsys, _args("--benchmark", "gsm8k", "--path", "unused.jsonl", "--backend", "vllm"))
    assert line == (f"ibpo-lit: error: {vllm_install_hint('--backend vllm')} "
                    "(ModuleNotFoundError: import of vllm halted; None in sys.modules)")
