"""evaluate() end to end on the built-in tiny model: keys, counts, seeds, checkpoints."""
import pytest
import torch

from ibpo_lit.evaluation import runner
from ibpo_lit.evaluation.runner import evaluate
from ibpo_lit.models.loading import load_policy

FAST = dict(k=2, max_new_tokens=8, batch_size=2)


def _comparable(result):
    return {key: value for key, value in result.items() if not key.endswith("seconds")}


def test_result_keys_and_counts(bench_path):
    result = evaluate("tiny-llama", "math500", bench_path, keep_completions=True, **FAST)
    for key in ("benchmark", "model", "ckpt", "k", "n_problems", "seed", "decoding", "avg@k", "pass@1",
                "pass@k", "maj@k", "response_len", "truncated_frac", "unscorable_frac", "seconds", "problems"):
        assert key in result, key
    assert result["n_problems"] == 3 and result["k"] == 2
    assert result["decoding"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "max_new_tokens": 8,
                                  "repetition_penalty": 1.0}
    assert [p["uid"] for p in result["problems"]] == ["bench.jsonl:1", "bench.jsonl:2", "bench.jsonl:3"]
    assert [p["gold"] for p in result["problems"]] == ["5", "42", "\\frac{1}{2}"]
    for p in result["problems"]:
        assert len(p["answers"]) == len(p["scores"]) == len(p["completions"]) == 2
        assert p["n_correct"] == sum(s == 1.0 for s in p["scores"])
    assert 0 < result["response_len"] <= 8
    assert 0 <= result["truncated_frac"] <= 1
    for metric in ("avg@k", "pass@1", "pass@k", "maj@k"):
        assert 0 <= result[metric] <= 1
    assert result["pass@1"] == pytest.approx(result["avg@k"])


def test_limit_and_batch_size_do_not_change_samples(bench_path):
    full = evaluate("tiny-llama", "math500", bench_path, keep_completions=True, **FAST)
    cut = evaluate("tiny-llama", "math500", bench_path, keep_completions=True, **dict(FAST, batch_size=1), limit=2)
    assert cut["n_problems"] == 2
    assert [p["completions"] for p in cut["problems"]] == [p["completions"] for p in full["problems"][:2]]


def test_seed_reproduces_and_varies(bench_path):
    a = evaluate("tiny-llama", "math500", bench_path, seed=1, keep_completions=True, **FAST)
    b = evaluate("tiny-llama", "math500", bench_path, seed=1, keep_completions=True, **FAST)
    c = evaluate("tiny-llama", "math500", bench_path, seed=2, keep_completions=True, **FAST)
    assert _comparable(a) == _comparable(b)
    completions = lambda r: [p["completions"] for p in r["problems"]]  # noqa: E731
    assert completions(a) != completions(c)


def test_the_repetition_penalty_reaches_the_sampler(bench_path):
    plain = evaluate("tiny-llama", "math500", bench_path, seed=1, keep_completions=True, **FAST)
    penalised = evaluate("tiny-llama", "math500", bench_path, seed=1, keep_completions=True, repetition_penalty=3.0,
                         **FAST)
    assert penalised["decoding"]["repetition_penalty"] == 3.0
    assert [p["completions"] for p in penalised["problems"]] != [p["completions"] for p in plain["problems"]]


def test_settings_fail_before_loading(monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("loaded data or a model despite a bad setting")

    monkeypatch.setattr(runner, "load_problems", no_load)
    with pytest.raises(ValueError, match="k must be"):
        evaluate("tiny-llama", "gsm8k", None, k=0)
    with pytest.raises(ValueError, match="temperature"):
        evaluate("tiny-llama", "gsm8k", None, temperature=0.0)
    with pytest.raises(ValueError, match="dtype"):
        evaluate("tiny-llama", "gsm8k", None, dtype="float8")


def _save_ckpt(path, model, extra=None):
    state = {f"policy.{key}": value for key, value in model.state_dict().items()}
    state.update({f"ref_policy.{key}": torch.zeros_like(value) for key, value in model.state_dict().items()})
    torch.save({"state_dict": state, "hyper_parameters": {"model": "tiny-llama"}, **(extra or {})}, path)


def test_checkpoint_weights_are_evaluated(bench_path, tmp_path):
    trained, tokenizer = load_policy("tiny-llama")
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for param in trained.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.5)
    ckpt = tmp_path / "last.ckpt"
    _save_ckpt(ckpt, trained)
    trained.save_pretrained(tmp_path / "trained")
    tokenizer.save_pretrained(tmp_path / "trained")

    greedy = dict(FAST, top_k=1, keep_completions=True)
    from_ckpt = evaluate("tiny-llama", "math500", bench_path, ckpt_path=str(ckpt), **greedy)
    from_dir = evaluate(str(tmp_path / "trained"), "math500", bench_path, **greedy)
    untrained = evaluate("tiny-llama", "math500", bench_path, **greedy)
    completions = lambda r: [p["completions"] for p in r["problems"]]  # noqa: E731
    assert completions(from_ckpt) == completions(from_dir)
    assert completions(from_ckpt) != completions(untrained)
    assert from_ckpt["ckpt"] == str(ckpt)


def test_checkpoint_errors(bench_path, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        evaluate("tiny-llama", "math500", bench_path, ckpt_path=str(tmp_path / "missing.ckpt"), **FAST)
    no_policy = tmp_path / "no_policy.ckpt"
    torch.save({"state_dict": {"other.weight": torch.zeros(1)}}, no_policy)
    with pytest.raises(ValueError, match="no 'policy"):
        evaluate("tiny-llama", "math500", bench_path, ckpt_path=str(no_policy), **FAST)
    other_arch = tmp_path / "qwen.ckpt"
    _save_ckpt(other_arch, load_policy("tiny-qwen3")[0])
    with pytest.raises(ValueError, match="does not fit"):
        evaluate("tiny-llama", "math500", bench_path, ckpt_path=str(other_arch), **FAST)
