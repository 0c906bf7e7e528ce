"""The one-run table: the metrics a result has, the sandbox's counts, what each baseline is."""
from ibpo_lit.evaluation.report import run_table


def test_run_table_shows_what_the_result_has():
    result = {"benchmark": "humaneval", "model": "m", "n_problems": 2, "seed": 0, "k": 4, "seconds": 3.0,
              "avg@k": 0.5, "pass@1": 0.5, "pass@k": 0.75, "maj@k": None, "test_pass_frac": 0.625,
              "best_of_n": 0.75, "sandbox_status": {"pass": 4, "fail": 3, "error": 1},
              "ttc_sandbox_status": {"pass": 5, "fail": 3}, "baselines": {"best_of_n": "is pass@N"}}
    lines = run_table(result).splitlines()
    assert lines[0] == ("| benchmark | model | n | seed | avg@4 | pass@1 | pass@4 | maj@4 | test_pass_frac "
                        "| best_of_n | seconds |")
    assert lines[2] == "| humaneval | m | 2 | 0 | 0.5000 | 0.5000 | 0.7500 | - | 0.6250 | 0.7500 | 3.0 |"
    assert lines[3:] == ["sandbox_status: pass 4, fail 3, error 1", "ttc_sandbox_status: pass 5, fail 3",
                         "best_of_n: is pass@N"]
