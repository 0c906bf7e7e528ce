"""evaluate_main: evaluate mode writes JSON and a table; --combine mode; --help."""
import json

import pytest

from ibpo_lit.evaluation.cli import evaluate_main


def test_evaluate_writes_json_and_prints_table(bench_path, tmp_path, capsys):
    outputs = []
    for seed in (0, 1):
        out = tmp_path / f"seed{seed}.json"
        argv = ["--model_name_or_path", "tiny-llama", "--benchmark", "math500", "--path", bench_path,
                "--k", "2", "--max_new_tokens", "4", "--seed", str(seed), "--output", str(out)]
        assert evaluate_main(argv) == 0
        result = json.loads(out.read_text())
        assert result["seed"] == seed and result["n_problems"] == 3 and result["k"] == 2
        outputs.append(str(out))
    table = capsys.readouterr().out
    assert "| avg@2 |" in table and "tiny-llama" in table

    combined_path = tmp_path / "combined.json"
    assert evaluate_main(["--combine", *outputs, "--output", str(combined_path)]) == 0
    printed = capsys.readouterr().out
    assert "95% CI" in printed and "maj@2" in printed
    combined = json.loads(combined_path.read_text())
    assert combined["n_runs"] == 2 and combined["seeds"] == [0, 1]
    assert set(combined["metrics"]) >= {"avg@k", "pass@1", "pass@k", "maj@k"}


def test_help_lists_documented_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--ckpt_path" in text and "Lightning checkpoint" in text
    assert "--combine" in text and "--output" in text


def test_missing_required_option_fails():
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main(["--benchmark", "gsm8k"])
    assert exit_info.value.code != 0


def test_new_options_parse():
    from ibpo_lit.evaluation.baselines import parse_baselines
    from ibpo_lit.evaluation.cli import build_parser

    base = ["--model_name_or_path", "tiny-llama", "--benchmark", "mbpp"]
    cfg = build_parser().parse_args(base)
    assert (cfg.mbpp_split, cfg.sandbox_workers, tuple(cfg.baselines), cfg.instruction) == ("test", 2, (), None)
    for value in ("test_time_correction,best_of_n", "[test_time_correction, best_of_n]"):
        cfg = build_parser().parse_args(base + ["--baselines", value, "--mbpp_split", "validation",
                                                "--sandbox_workers", "4"])
        assert parse_baselines(cfg.baselines, k=4) == ("test_time_correction", "best_of_n")
        assert (cfg.mbpp_split, cfg.sandbox_workers) == ("validation", 4)
    cfg = build_parser().parse_args(base + ["--baselines+", "best_of_n", "--baselines+", "test_time_correction_oracle"])
    assert parse_baselines(cfg.baselines, k=4) == ("best_of_n", "test_time_correction_oracle")


def test_help_documents_code_and_baselines(capsys):
    with pytest.raises(SystemExit):
        evaluate_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for phrase in ("humaneval, mbpp, mbpp_sanitized", "--baselines", "ORACLE", "which IS pass@N",
                   "--mbpp_split", "--sandbox_workers"):
        assert phrase in text, phrase


def test_unknown_baseline_from_the_command_line_is_a_clear_error(bench_path):
    argv = ["--model_name_or_path", "tiny-llama", "--benchmark", "math500", "--path", bench_path,
            "--baselines", "best_of_n,majority"]
    with pytest.raises(ValueError, match=r"unknown baseline\(s\) \['majority'\]"):
        evaluate_main(argv)


def _code_run(seed, ttc, best):
    return {"benchmark": "mbpp", "model": "m", "ckpt": None, "k": 4, "n_problems": 10, "seed": seed,
            "avg@k": 0.25, "pass@1": 0.25, "pass@k": best, "maj@k": None, "test_pass_frac": 0.5,
            "best_of_n": best, "best_of_n_majority": None, "ttc@1": ttc, "ttc_fixed": 0.1, "ttc_broken": 0.2,
            "response_len": 100.0, "truncated_frac": 0.0, "unscorable_frac": 0.0, "seconds": 1.0,
            "sandbox_status": {"pass": 10, "fail": 30, "timeout": 0, "memory": 0, "error": 0, "unscorable": 0}}


def test_combine_carries_code_and_baseline_metrics(tmp_path, capsys):
    paths = []
    for seed, ttc, best in ((0, 0.3, 0.5), (1, 0.4, 0.6)):
        path = tmp_path / f"s{seed}.json"
        path.write_text(json.dumps(_code_run(seed, ttc, best)))
        paths.append(str(path))
    out = tmp_path / "combined.json"
    assert evaluate_main(["--combine", *paths, "--output", str(out)]) == 0
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["ttc@1"]["values"] == [0.3, 0.4] and metrics["ttc@1"]["mean"] == pytest.approx(0.35)
    assert metrics["best_of_n"]["values"] == [0.5, 0.6] and metrics["test_pass_frac"]["mean"] == 0.5
    assert metrics["ttc_fixed"]["mean"] == 0.1 and metrics["ttc_broken"]["mean"] == 0.2
    assert "maj@k" not in metrics and "best_of_n_majority" not in metrics  # None for code
    table = capsys.readouterr().out
    assert "| ttc@1 | 0.3500 |" in table and "| test_pass_frac | 0.5000 |" in table
