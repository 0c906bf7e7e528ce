"""The report's figures: written for a table with runs, skipped for one without."""
from ibpo_lit.experiments.report_plots import table_figure
from ibpo_lit.experiments.tables import REPORT_TABLES

SPECS = {spec.name: spec for spec in REPORT_TABLES}


def run(arm, seed, grad_var):
    series = {"compute/flops": [[0, 1e12], [1, 2e12]], "train/reward": [[0, 0.2], [1, 0.4]],
              "train/correction_success": [[0, 0.1], [1, 0.3]], "ibpo/cov_y_phi": [[0, -0.02], [1, -0.01]]}
    return {"arm": arm, "seed": seed, "comparison": "results/a", "grad_var_trace": grad_var, "series": series}


def test_figure_is_written_for_a_table_with_runs(tmp_path):
    summaries = [run("gspo_large_group", s, 2.0) for s in range(2)] + [run("k1", s, 1.0 + s) for s in range(2)]
    path = tmp_path / "ablations.png"
    assert table_figure(SPECS["ablations"], summaries, str(path))
    assert path.stat().st_size > 10_000


def test_no_figure_for_a_table_without_runs(tmp_path):
    path = tmp_path / "lambda.png"
    assert not table_figure(SPECS["lambda"], [run("k1", 0, 1.0)], str(path))
    assert not path.exists()
