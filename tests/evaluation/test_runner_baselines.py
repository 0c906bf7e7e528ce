"""evaluate(baselines=...): test-time correction (verifier-free and oracle) and Best-of-N."""
import pytest

from ibpo_lit.data.correction_prompt import CorrectionPrompt
from ibpo_lit.evaluation import correction_baseline, runner
from ibpo_lit.evaluation.runner import evaluate
from ibpo_lit.training.seeding import CORRECTIONS, rollout_seeds

ALL = ["test_time_correction", "test_time_correction_oracle", "best_of_n"]
FAST = dict(k=2, max_new_tokens=4)


def test_math_baselines_on_the_tiny_model_do_not_depend_on_batch_size(bench_path):
    one = evaluate("tiny-llama", "math500", bench_path, baselines=ALL, batch_size=1, keep_completions=True, **FAST)
    three = evaluate("tiny-llama", "math500", bench_path, baselines=",".join(ALL), batch_size=3,
                     keep_completions=True, **FAST)
    for prefix in ("ttc", "ttc_oracle"):
        fields = (f"{prefix}_refs", f"{prefix}_completions", f"{prefix}_scores")
        assert [[p[f] for f in fields] for p in one["problems"]] == [[p[f] for f in fields] for p in three["problems"]]
        # with k = 2 the only other sample is the reference
        assert all(p[f"{prefix}_refs"] == [1, 0] for p in one["problems"])
        scores = [s == 1.0 for p in one["problems"] for s in p[f"{prefix}_scores"]]
        assert one[f"{prefix}@1"] == sum(scores) / 6
    assert one["best_of_n"] == one["pass@k"] and one["best_of_n_majority"] == one["maj@k"]
    assert set(one["baselines"]) == set(ALL)
    assert "ORACLE" in one["baselines"]["test_time_correction_oracle"]
    assert "pass@N" in one["baselines"]["best_of_n"]
    # the corrections are new samples, drawn with the CORRECTIONS stream: not copies of the samples
    assert any(p["ttc_completions"] != p["completions"] for p in one["problems"])


def test_code_correction_prompts_seeds_and_metrics_by_hand(mbpp_path, monkeypatch):
    add = ["def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n",
           "def add(a, b):\n    return b + a\n"]
    square = ["def square(x):\n    return x * 2\n", "def square(x):\n    return x\n", "def square(x):\n    return 0\n"]
    seen = []

    def fake_sample(engine, tokenizer, prompts, k, seed, batch_size):
        seen.extend(prompts)
        return [add, square], [[5] * k] * 2, [[True] * k] * 2

    # corrections, prompt-major: "add" keeps 0, fixes 1, breaks 2; "square" gets 0 fixed only
    corrections = [add[0], add[0], add[1], "def square(x):\n    return x * x\n", square[1], square[2]]
    calls = []

    def fake_generate(engine, tokenizer, prompt_ids, n, seeds, prompts_per_call, what="problems"):
        calls.append({"ids": list(prompt_ids), "n": n, "seeds": list(seeds), "per_call": prompts_per_call})
        return [[c] for c in corrections], [[5]] * 6, [[True]] * 6

    monkeypatch.setattr(runner, "sample", fake_sample)
    monkeypatch.setattr(correction_baseline, "generate", fake_generate)
    result = evaluate("tiny-llama", "mbpp", mbpp_path, k=3, seed=7, batch_size=4,
                      baselines=["test_time_correction", "test_time_correction_oracle"])
    # before = [[1, 0, 1], [0, 0, 0]], after = [[1, 1, 0], [1, 0, 0]]:
    # 3/6 right after; 2 of the 4 wrong samples fixed; 1 of the 2 right samples broken
    for prefix in ("ttc", "ttc_oracle"):
        assert (result[f"{prefix}@1"], result[f"{prefix}_fixed"], result[f"{prefix}_broken"]) == (0.5, 0.5, 0.5)
        assert result[f"{prefix}_sandbox_status"]["pass"] == 3
    assert result["problems"][0]["ttc_scores"] == [1.0, 1.0, 0.0]

    # the oracle shows a correct sample the other correct one, a wrong one either correct one
    oracle_refs = result["problems"][0]["ttc_oracle_refs"]
    assert oracle_refs[0] == 2 and oracle_refs[1] in (0, 2) and oracle_refs[2] == 0
    # no correct sample for "square" and no answers in code: both pick uniformly among the others,
    # with the same per-sample generators, so they pick alike
    assert result["problems"][1]["ttc_oracle_refs"] == result["problems"][1]["ttc_refs"]
    assert all(r != j for p in result["problems"] for key in ("ttc_refs", "ttc_oracle_refs")
               for j, r in enumerate(p[key]))

    # one correction per sample, seeded per (problem, sample), batch_size problems per call;
    # both variants draw with the same seeds (they differ only by the reference)
    expected_seeds = rollout_seeds(7, 0, CORRECTIONS, 3) + rollout_seeds(7, 1, CORRECTIONS, 3)
    assert [(c["n"], c["seeds"], c["per_call"]) for c in calls] == [(1, expected_seeds, 12)] * 2
    # training's correction prompt (the code template), sample j against its reference
    from ibpo_lit.models.loading import load_tokenizer

    tokenizer, builder = load_tokenizer("tiny-llama"), CorrectionPrompt()
    for call, key in zip(calls, ("ttc_refs", "ttc_oracle_refs")):
        for p, samples in enumerate([add, square]):
            refs = result["problems"][p][key]
            for j in range(3):
                expected = builder.ids(tokenizer, seen[p], samples[j], samples[refs[j]])
                assert call["ids"][p * 3 + j] == expected
    assert "Candidate solution 2:\n```python\n" in tokenizer.decode(calls[0]["ids"][0])


def test_baseline_errors_come_before_loading(bench_path, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("loaded data or a model despite a bad setting")

    monkeypatch.setattr(runner, "load_problems", no_load)
    with pytest.raises(ValueError, match=r"unknown baseline\(s\) \['best_of_64'\]; valid names"):
        evaluate("tiny-llama", "math500", bench_path, baselines=["best_of_64"])
    with pytest.raises(ValueError, match="needs k >= 2"):
        evaluate("tiny-llama", "math500", bench_path, k=1, baselines="test_time_correction")


def test_too_long_correction_prompt_stops_before_generating(bench_path, monkeypatch):
    def no_generate(*args, **kwargs):
        raise AssertionError("generated corrections despite a prompt over the limit")

    monkeypatch.setattr(correction_baseline, "generate", no_generate)
    # the samples' prompts (about 95 tokens) fit; quoting two answers under the template does not
    too_long = r"correction prompt of bench.jsonl:1 sample 0 has \d+ tokens > max_prompt_tokens=150"
    with pytest.raises(ValueError, match=too_long):
        evaluate("tiny-llama", "math500", bench_path, max_prompt_tokens=150, baselines=["test_time_correction"], **FAST)
