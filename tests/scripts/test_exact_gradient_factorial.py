"""scripts/exact_gradient_factorial.py: it refuses a protocol git does not hold unchanged, its
endpoints and Holm adjustment are right on hand-computed cases, and its report prints every
endpoint x setting x contrast the committed protocol names."""
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "results" / "exact_gradient_factorial" / "protocol.yaml"


@pytest.fixture(scope="module")
def script(load_script):
    return load_script("exact_gradient_factorial")


def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def test_refuses_an_uncommitted_or_modified_protocol(script, tmp_path):
    _git(tmp_path, "init", "-q")
    protocol = tmp_path / "protocol.yaml"
    shutil.copy(PROTOCOL, protocol)
    with pytest.raises(script.ProtocolError, match="not committed"):
        script.protocol_commit(protocol)
    _git(tmp_path, "add", "protocol.yaml")  # staged is not committed
    with pytest.raises(script.ProtocolError, match="differs from its last commit"):
        script.protocol_commit(protocol)
    _git(tmp_path, "commit", "-q", "-m", "protocol")
    commit = _git(tmp_path, "rev-parse", "HEAD").strip()
    assert script.protocol_commit(protocol) == commit
    protocol.write_text(protocol.read_text().replace("count: 200", "count: 100"))
    with pytest.raises(script.ProtocolError, match="differs from its last commit"):
        script.protocol_commit(protocol)
    with pytest.raises(script.ProtocolError, match="differs from its last commit"):  # main checks before anything
        script.main(["--protocol", str(protocol), "--report", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_the_repository_protocol_is_committed_and_its_family_adds_up(script):
    protocol = script.load_protocol(PROTOCOL)
    assert protocol["inference"]["family_size"] == 3 * 6 * 7 == 126
    assert len(script.protocol_commit(PROTOCOL)) == 40


def test_holm_on_a_hand_computed_example(script):
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> raised to 0.06
    assert script.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert script.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    # unlike Bonferroni, the second-smallest is multiplied by m - 1 only
    assert script.holm([0.01, 0.02, 0.9]) == pytest.approx([0.03, 0.04, 0.9])


def test_endpoints_on_a_hand_computed_curve(script):
    curve, axis = [0.1, 0.5, 0.9], [0, 64, 128]
    assert script.mean_over(curve, axis, 100) == pytest.approx((0.1 * 64 + 0.5 * 36) / 100)
    assert script.mean_over(curve, axis, 128) == pytest.approx((0.1 + 0.5) / 2)
    record = {"curve": curve, "sequences": axis, "context_tokens": [0, 900, 1800], "setting": "s", "arm": "a",
              "seed": 0}
    assert script.endpoint(record, {"kind": "value_at", "budget": 100}, "sequences", 8) == 0.5
    # tokens in sequence-equivalents: 900 / (1 + 8) = 100 -> J after that step
    assert script.endpoint(record, {"kind": "value_at", "budget": 100}, "context_tokens", 8) == 0.5
    with pytest.raises(ValueError):
        script.mean_over(curve, axis, 200)  # the run never reached the budget


def _synthetic_records(script, protocol, seeds):
    """A run record for every (setting, arm, seed) the script would run, with made-up curves."""
    rng = random.Random(0)
    records = []
    for setting_name in protocol["settings"]:
        length = script.setting(protocol, setting_name)["length"]
        shared = (protocol.get("shared_runs") or {}).get(setting_name, {})
        for arm in protocol["arms"]:
            if arm in shared:
                continue
            for seed in seeds:
                steps, rate = 100, rng.uniform(0.005, 0.02)
                records.append({"protocol_commit": "x" * 40, "setting": setting_name, "arm": arm, "seed": seed,
                                "seconds": 1.0, "curve": [min(1.0, 0.2 + rate * i) for i in range(steps + 1)],
                                "sequences": [100 * i for i in range(steps + 1)],
                                "context_tokens": [150 * (1 + length) * i for i in range(steps + 1)]})
    return records


def test_report_prints_every_endpoint_of_the_family(script):
    protocol = script.load_protocol(PROTOCOL)
    result = script.analyze(protocol, _synthetic_records(script, protocol, range(4)))
    assert result["tested"] == 126 and not result["complete"]  # 4 seeds, not the protocol's 200
    header = {"protocol_commit": "x" * 40, "protocol_sha256": "0" * 64, "code_commit": "y" * 40, "code_dirty": False}
    text = script.report_text(protocol, result, header)
    rows = [line.split(" | ") for line in text.splitlines()
            if line.startswith("| ") and line.split(" | ")[1] in protocol["contrasts"]]
    named = {(s, c, e) for s in protocol["settings"] for c in protocol["contrasts"] for e in protocol["endpoints"]}
    assert {(r[0][2:], r[1], r[2]) for r in rows} == named and len(rows) == len(named) == 126
    p_raw = [float(r[8]) for r in rows]
    assert all(re.fullmatch(r"[\d.e+-]+", r[9]) for r in rows)  # every row has its Holm p
    assert [float(r[9]) for r in rows] == pytest.approx(script.holm(p_raw), rel=0.05)  # printed to 2 digits
    assert "Incomplete" in text and "ibpo_vs_gspo_tok" in text


def test_the_report_names_the_code_of_its_runs_and_whether_the_testbed_changed(script, tmp_path, monkeypatch):
    """A factorial resumed over several sessions holds runs of several commits: the report lists them
    and says whether the testbed differs between them (a change outside it does not count)."""
    _git(tmp_path, "init", "-q")
    testbed = tmp_path / "ibpo_lit" / "algorithms"
    testbed.mkdir(parents=True)
    (testbed / "shaping.py").write_text("LAM = 0.6\n")
    (tmp_path / "README.md").write_text("a\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "one")
    first = _git(tmp_path, "rev-parse", "HEAD").strip()
    (tmp_path / "README.md").write_text("b\n")  # outside the testbed
    _git(tmp_path, "commit", "-qam", "two")
    second = _git(tmp_path, "rev-parse", "HEAD").strip()
    (testbed / "shaping.py").write_text("LAM = 0.5\n")
    _git(tmp_path, "commit", "-qam", "three")
    third = _git(tmp_path, "rev-parse", "HEAD").strip()
    monkeypatch.setattr(script, "ROOT", tmp_path)

    def records(*commits):
        return [{"code_commit": c, "code_dirty": i == 0} for i, c in enumerate(commits)]

    same = script.code_of_runs(records(first, second, second))
    assert same == {"commits": [[first, 1, 1], [second, 2, 0]], "testbed_identical": True}
    assert script.code_of_runs(records(first, second, third))["testbed_identical"] is False

    protocol = script.load_protocol(PROTOCOL)
    result = {**script.analyze(protocol, _synthetic_records(script, protocol, range(2))), "runs_code": same}
    header = {"protocol_commit": "x" * 40, "protocol_sha256": "0" * 64, "code_commit": third, "code_dirty": False}
    text = script.report_text(protocol, result, header)
    assert (f"Runs made at code: 1 at `{first[:12]}` (1 of them with uncommitted testbed changes), 2 at "
            f"`{second[:12]}`; the testbed (`ibpo_lit/experiments/exact_gradient`, `ibpo_lit/algorithms`) is "
            "identical at all of them.") in text
    assert f"report written at code `{third[:12]}`" in text
    changed = {**result, "runs_code": script.code_of_runs(records(first, third))}
    assert "**not** identical" in script.report_text(protocol, changed, header)


def test_packed_records_read_back_the_same_and_pack_to_the_same_bytes(script, tmp_path):
    """runs.jsonl.xz is what git keeps of a finished factorial: read back, it is the runs; packed
    from the runs in another order, it is the same file; with runs/ present, runs/ is read."""
    protocol = script.load_protocol(PROTOCOL)
    records = _synthetic_records(script, protocol, range(2))
    script.pack_records(tmp_path, records)
    first = (tmp_path / script.PACKED).read_bytes()
    key = lambda r: (r["setting"], r["arm"], r["seed"])  # noqa: E731
    assert sorted(script.read_records(tmp_path, "x" * 40), key=key) == sorted(records, key=key)
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    script.pack_records(tmp_path, shuffled)
    assert (tmp_path / script.PACKED).read_bytes() == first
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "default.shard0of1.jsonl").write_text(script.json.dumps(records[0]) + "\n")
    assert script.read_records(tmp_path, "x" * 40) == [records[0]]
    shutil.rmtree(tmp_path / "runs")
    with pytest.raises(script.ProtocolError, match=r"runs\.jsonl\.xz holds runs of protocol commit xxxx"):
        script.read_records(tmp_path, "y" * 40)  # the packed file's protocol is checked too
