"""The comparison's final evaluation (ibpo_lit/experiments/final_eval.py): the held-out file is
the validation set's stream, the command is one `evaluate` accepts, and the paired bootstrap
gives the known answer on made-up runs."""
import json

import numpy as np
import pytest

from ibpo_lit.data import PromptDataModule
from ibpo_lit.data.arithmetic import ArithmeticConfig
from ibpo_lit.data.records import read_records
from ibpo_lit.data.benchmarks import BENCHMARKS
from ibpo_lit.evaluation.cli import build_parser
from ibpo_lit.experiments.final_eval import evaluate_command, paired_difference, read_result, write_held_out
from ibpo_lit.models.tiny import build_tiny_tokenizer

ARITHMETIC = {"min_digits": 1, "max_digits": 2, "ops": ["+", "*"], "seed": 3}
CFG = {"model": {"model": "tiny-llama", "rollout": {"sampling": {"temperature": 0.7, "max_new_tokens": 24}}},
       "data": {"arithmetic": ARITHMETIC, "instruction": "Answer after ####.", "max_prompt_tokens": 128}}


def test_held_out_file_starts_with_the_validation_set(tmp_path):
    path = tmp_path / "held_out.jsonl"
    write_held_out(CFG, 40, str(path))
    records = list(read_records(str(path), BENCHMARKS["gsm8k"].fmt))
    dm = PromptDataModule(arithmetic=ArithmeticConfig(**ARITHMETIC), val_size=10)
    dm.tokenizer_obj = build_tiny_tokenizer()
    dm.setup("fit")
    val = dm.val_prompts()
    assert len(records) == 40
    assert [(r.problem, r.gold) for r in records[:10]] == [(p.problem, p.gold) for p in val]
    # ... and not the training stream's problems
    train = [p.problem for batch in zip(range(10), dm.train_dataloader()) for p in batch[1]]
    assert len(set(train) & {r.problem for r in records}) < len(train) // 2
    golds = [int(r.gold) for r in records]
    assert all(eval(r.problem.removeprefix("What is ").removesuffix("?")) == g for r, g in zip(records, golds))


def test_runs_on_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="evaluate its data.val_path"):
        write_held_out({"model": CFG["model"], "data": {"source": "file", "train_path": "x.jsonl"}}, 5, str(tmp_path / "h"))
    with pytest.raises(ValueError, match="chat_template_kwargs"):
        write_held_out({"model": CFG["model"], "data": {"chat_template_kwargs": {"enable_thinking": False}}}, 5,
                       str(tmp_path / "h"))


def test_command_carries_the_runs_prompt_and_sampling():
    cmd = evaluate_command(CFG, "ck/last.ckpt", "h.jsonl", n=200, k=8, backend="vllm", seed=2, output="o.json")
    assert cmd[1:4] == ["-m", "ibpo_lit", "evaluate"]
    cfg = build_parser().parse_args(cmd[4:])
    assert (cfg.model_name_or_path, cfg.benchmark, cfg.path, cfg.limit, cfg.k, cfg.seed) == (
        "tiny-llama", "gsm8k", "h.jsonl", 200, 8, 2)
    # the rollout's sampling, SamplingConfig's defaults where the run sets none (not evaluate's)
    assert (cfg.temperature, cfg.top_p, cfg.top_k, cfg.min_p, cfg.max_new_tokens) == (0.7, 1.0, 0, 0.0, 24)
    assert (cfg.instruction, cfg.max_prompt_tokens, cfg.ckpt_path, cfg.backend) == (
        "Answer after ####.", 128, "ck/last.ckpt", "vllm")
    assert "--ckpt_path" not in evaluate_command(CFG, None, "h.jsonl", 2, 2, "hf", 0, "o.json")


def test_read_result_keeps_each_problems_count(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"avg@k": 0.375, "k": 4, "n_problems": 2, "backend": "vllm", "seconds": 9.5,
                                "problems": [{"n_correct": 3}, {"n_correct": 0}]}))
    assert read_result(str(path)) == {"final_eval": 0.375, "final_eval_correct": [3, 0], "final_eval_k": 4,
                                      "final_eval_problems": 2, "final_eval_backend": "vllm", "final_eval_seconds": 9.5}


def _runs(arm, correct_by_seed, k=4):
    return [{"arm": arm, "seed": s, "final_eval_correct": c, "final_eval_k": k} for s, c in correct_by_seed.items()]


def test_paired_difference_known_answers():
    rng = np.random.default_rng(0)
    base = {s: rng.integers(0, 5, size=300).tolist() for s in range(3)}
    # one more correct sample out of 4 on every problem: exactly +0.25 at every seed, no spread
    better = {s: [c + 1 for c in base[s]] for s in base}
    mean, low, high, seeds = paired_difference(_runs("a", better), _runs("b", base))
    assert (mean, low, high, seeds) == pytest.approx((0.25, 0.25, 0.25, 3))
    # a run against itself: zero
    assert paired_difference(_runs("a", base), _runs("b", base))[:3] == (0.0, 0.0, 0.0)
    # per-seed differences by hand: seed s gets s extra correct samples on the first 100 problems of
    # 300 (k = 4): +0, +1/12, +2/12 -> mean 1/12, sd 1/12, half width 4.3027 * (1/12) / sqrt(3)
    shifted = {s: [c + (s if i < 100 else 0) for i, c in enumerate(base[s])] for s in base}
    mean, low, high, _ = paired_difference(_runs("a", shifted), _runs("b", base))
    half = 4.302652729749462 / 12 / np.sqrt(3)
    assert (mean, low, high) == pytest.approx((1 / 12, 1 / 12 - half, 1 / 12 + half))
    # one seed: the mean, no interval
    mean, low, high, seeds = paired_difference(_runs("a", {0: shifted[0]}), _runs("b", base))
    assert seeds == 1 and np.isnan(low) and np.isnan(high)
    # seeds without a partner are left out; none at all gives None
    assert paired_difference(_runs("a", {7: base[0]}), _runs("b", base)) is None
    with pytest.raises(ValueError, match="different numbers of problems"):
        paired_difference(_runs("a", {0: base[0][:10]}), _runs("b", base))


def test_paired_difference_interval_covers_the_truth_at_the_nominal_rate():
    # Problems have their own difficulty, seeds (training runs) their own offset, larger than the
    # problems' noise: the t-interval over 3 seeds should cover the true difference (0.05) in about
    # 95% of repeated experiments (here 200 of them; a percentile bootstrap over seeds gives ~75%).
    rng = np.random.default_rng(1)
    covered = 0
    for trial in range(200):
        p = rng.uniform(0.1, 0.9, size=200)
        base, arm = {}, {}
        for s in range(3):
            offset = rng.normal(0, 0.05)
            base[s] = rng.binomial(4, p).tolist()
            arm[s] = rng.binomial(4, np.clip(p + 0.05 + offset, 0, 1)).tolist()
        _, low, high, _ = paired_difference(_runs("a", arm), _runs("b", base))
        covered += low <= 0.05 <= high
    assert 180 <= covered <= 198
