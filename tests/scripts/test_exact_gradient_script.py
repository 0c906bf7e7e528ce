"""scripts/exact_gradient.py end to end at tiny counts: its JSON and the tables made of it."""
import json

import pytest


@pytest.fixture(scope="module")
def script(load_script):
    return load_script("exact_gradient")


def test_fixed_and_curves_stages_write_json_and_tables(script, tmp_path, one_intra_op_thread):
    script.main(["--stage", "fixed", "--quick", "--out", str(tmp_path)])
    script.main(["--stage", "curves", "--quick", "--out", str(tmp_path)])
    fixed = json.loads((tmp_path / "fixed.json").read_text())
    assert set(fixed["states"]) == {"init", "J>=0.4", "J>=0.6"}
    rows = fixed["rows"]["init"]
    names = [r["method"] for r in rows]
    assert names[0] == "gspo" and "ibpo_plain" in names and any(n.startswith("gspo_G") for n in names)
    assert rows[0]["vs_gspo"]["trace"][0] == pytest.approx(1.0)
    ibpo = next(r for r in rows if r["method"] == "ibpo_plain")
    assert ibpo["sequences"] > rows[0]["sequences"] and ibpo["cost_ratio"] > 1
    curves = json.loads((tmp_path / "curves.json").read_text())
    assert {r["label"] for r in curves["runs"]} >= {"gspo", "gspo_G4", "ibpo_plain_G4"}
    assert all(len(r["curve"]) == 6 for r in curves["runs"])  # 5 steps: J before each and after the last
    report = (tmp_path / "report.md").read_text()
    assert "## Fixed policy, state `init`" in report and "## Learning curves, 2 seeds" in report
    assert "| ibpo_plain | 8 |" in report
