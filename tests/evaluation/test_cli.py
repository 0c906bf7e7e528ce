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
