"""The pre-registered factorial in the exact-gradient testbed (issue 46, item 1).

    nice -n 10 python scripts/exact_gradient_factorial.py --quick        # smoke: 2 seeds, under quick/
    nice -n 10 python scripts/exact_gradient_factorial.py --shard 0/2 &  # the factorial, one shard per core
    nice -n 10 python scripts/exact_gradient_factorial.py --shard 1/2 &
    python scripts/exact_gradient_factorial.py --report                  # report.md and results.json again

Everything the runs and the analysis do is read from the protocol
(``results/exact_gradient_factorial/protocol.yaml``: arms, settings, seeds, budgets, endpoints,
contrasts, the Holm family); docs/exact_gradient.md, "Pre-registered factorial", says it in prose.
The script refuses to start, in any mode, unless that file is tracked by git, committed and
unchanged (``git status --porcelain`` of its path is empty), and writes the commit that last
touched it (and the file's SHA-256) into every run record and every result; the report refuses
records of another protocol commit.

Runs are appended one JSON line each to ``<out>/runs/<setting>.shard<i>of<n>.jsonl`` as they
finish; a (setting, arm, seed) already in any file under ``<out>/runs`` (or, with ``runs/`` empty, in the
packed file below) is skipped, so a killed
run resumes where it stopped. ``--shard i/n`` takes the seeds with ``index % n == i``.

Once every run is there, ``--report`` also packs the records into ``<out>/runs.jsonl.xz`` (sorted,
so the same runs give the same bytes; 3.3 MB for the 6,800, which git keeps while ``runs/`` is
ignored), and reads that file when ``runs/`` is absent: a clone can rebuild the report, and
tests/docs recompute the numbers the pages quote from it.

The report prints every endpoint x setting x contrast of the family, the null ones included: the
paired estimate, its 95% t-interval, the Bonferroni interval of the family, the raw and the
Holm-adjusted p-value. Not covered: anything the protocol does not name (no extra contrasts, no
subgroups, no other endpoints).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ibpo_lit.evaluation.bootstrap import t_interval  # noqa: E402
from ibpo_lit.experiments.exact_gradient.corrector import CorrectorSpec  # noqa: E402
from ibpo_lit.experiments.exact_gradient.estimators import Method  # noqa: E402
from ibpo_lit.experiments.exact_gradient.measure import learning_curve, value_at_budget  # noqa: E402
from ibpo_lit.experiments.exact_gradient.problem import Problem  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "results" / "exact_gradient_factorial" / "protocol.yaml"
OUT = ROOT / "results" / "exact_gradient_factorial"
SETTING_KEYS = ("lr", "length", "group_size", "problem_seed", "marker")
QUICK_SEEDS = 2
PACKED = "runs.jsonl.xz"  # every run record of a finished factorial, beside the report


class ProtocolError(RuntimeError):
    """The protocol is not committed, or has changed since, or does not add up."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------- the protocol and git
def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ProtocolError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout


def protocol_commit(path: Path) -> str:
    """The commit that last changed ``path``; ProtocolError unless the file is tracked,
    committed, and unchanged in the working tree and the index."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ProtocolError(f"no protocol at {path}")
    cwd = path.parent
    if subprocess.run(["git", "ls-files", "--error-unmatch", path.name], cwd=cwd, capture_output=True).returncode:
        raise ProtocolError(f"{path} is not committed (git does not track it): commit the protocol before any run")
    status = _git(cwd, "status", "--porcelain", "--", path.name).strip()
    if status:
        raise ProtocolError(f"{path} differs from its last commit ({status!r}): a changed protocol is a new protocol; "
                            "commit it as a new file, never run an edited one")
    commit = _git(cwd, "log", "-n", "1", "--format=%H", "--", path.name).strip()
    if not commit:
        raise ProtocolError(f"{path} has no commit")
    return commit


def load_protocol(path: Path) -> dict:
    """The protocol, checked for internal consistency (the family size it states)."""
    protocol = yaml.safe_load(Path(path).read_text())
    size = len(protocol["endpoints"]) * len(protocol["settings"]) * len(protocol["contrasts"])
    if protocol["inference"]["family_size"] != size:
        raise ProtocolError(f"family_size {protocol['inference']['family_size']} != endpoints x settings x contrasts "
                            f"= {size}")
    for name, changes in protocol["settings"].items():
        unknown = set(changes or {}) - set(SETTING_KEYS)
        if unknown:
            raise ProtocolError(f"setting {name}: unknown keys {sorted(unknown)}; known: {SETTING_KEYS}")
    for name, contrast in protocol["contrasts"].items():
        if contrast["axis"] not in ("sequences", "context_tokens") or set(contrast["weights"]) - set(protocol["arms"]):
            raise ProtocolError(f"contrast {name}: bad axis or arm in {contrast}")
    return protocol


def stamp(path: Path) -> dict:
    """What every result carries: the protocol's commit and content hash, and the code's state."""
    dirty = _git(ROOT, "status", "--porcelain", "--", "ibpo_lit/experiments/exact_gradient",
                 "scripts/exact_gradient_factorial.py").strip()
    return {"protocol_commit": protocol_commit(path),
            "protocol_sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
            "code_commit": _git(ROOT, "rev-parse", "HEAD").strip(), "code_dirty": bool(dirty)}


# ---------------------------------------------------------------------- settings and arms
def setting(protocol: dict, name: str) -> dict:
    """The base with the setting's changes."""
    cfg = {**protocol["base"], "marker": protocol["base"]["corrector"].get("marker", False)}
    cfg.update(protocol["settings"][name] or {})
    return cfg


def problem_of(cfg: dict) -> Problem:
    return Problem(num_prompts=cfg["num_prompts"], length=cfg["length"], seed=cfg["problem_seed"])


def arm_method(protocol: dict, setting_name: str, arm: str) -> Method:
    cfg, spec = setting(protocol, setting_name), protocol["arms"][arm]
    if "gspo" in spec:
        return Method(arm, group_size=protocol["matched_group_size"][setting_name][spec["gspo"]])
    corrector = CorrectorSpec(**{**protocol["base"]["corrector"], "marker": cfg["marker"]})
    return Method(arm, variant=cfg["variant"], lam=float(spec["lam"]), beta=cfg["beta"], alpha=cfg["alpha"],
                  train_on_corrections=spec["train_on_corrections"], group_size=cfg["group_size"],
                  corrector=corrector)


def seeds_of(protocol: dict, quick: bool) -> list[int]:
    s = protocol["seeds"]
    return list(range(s["first"], s["first"] + (QUICK_SEEDS if quick else s["count"])))


def run_one(protocol: dict, setting_name: str, arm: str, seed: int) -> dict:
    """One learning curve to both budgets; its curve, costs and seconds."""
    cfg = setting(protocol, setting_name)
    budget = max(protocol["budgets"])
    start = time.perf_counter()
    out = learning_curve(arm_method(protocol, setting_name, arm), problem_of(cfg), seed, cfg["lr"],
                         protocol["max_steps"], hidden=cfg["hidden"],
                         until={"sequences": budget, "context_tokens": budget * (1 + cfg["length"])})
    if out["sequences"][-1] < budget or out["context_tokens"][-1] < budget * (1 + cfg["length"]):
        raise RuntimeError(f"{setting_name}/{arm}/{seed} stopped at max_steps before its budget")
    return {"setting": setting_name, "arm": arm, "seed": seed, "seconds": round(time.perf_counter() - start, 3),
            "curve": [round(v, 6) for v in out["curve"]], "sequences": out["sequences"],
            "context_tokens": out["context_tokens"], "final_accuracy": out["final_accuracy"]}


# ---------------------------------------------------------------------- run records
def record_lines(out: Path) -> list[tuple[Path, list[str]]]:
    """The run files' lines: ``out/runs/*.jsonl``, else the packed ``out/runs.jsonl.xz``."""
    paths = sorted((out / "runs").glob("*.jsonl"))
    if not paths and (out / PACKED).exists():
        with lzma.open(out / PACKED, "rt") as f:
            return [(out / PACKED, f.read().splitlines())]
    return [(path, path.read_text().splitlines()) for path in paths]


def pack_records(out: Path, records: list[dict]) -> None:
    """``out/runs.jsonl.xz``: the records sorted by (setting, arm, seed), one JSON line each."""
    ordered = sorted(records, key=lambda r: (r["setting"], r["arm"], r["seed"]))
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in ordered)
    tmp = out / f"{PACKED}.{os.getpid()}.tmp"
    with lzma.open(tmp, "wt", preset=9) as f:
        f.write(text)
    os.replace(tmp, out / PACKED)


def read_records(out: Path, commit: str) -> list[dict]:
    """Every run record under ``out/runs`` (or packed beside it); a record of another protocol
    commit is an error."""
    records = []
    for path, lines in record_lines(out):
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill: its run is redone
                continue
            if record["protocol_commit"] != commit:
                raise ProtocolError(f"{path} holds runs of protocol commit {record['protocol_commit'][:12]}, "
                                    f"not {commit[:12]}: results of two protocols do not mix")
            records.append(record)
    # One order however the runs were split into files (shards, or packed): sums over seeds then
    # come out bit-identical from runs/ and from the packed file.
    return sorted(records, key=lambda r: (r["setting"], r["arm"], r["seed"]))


def run(protocol: dict, out: Path, seeds: list[int], shard: tuple[int, int], header: dict) -> None:
    index, count = shard
    done = {(r["setting"], r["arm"], r["seed"]) for r in read_records(out, header["protocol_commit"])}
    (out / "runs").mkdir(parents=True, exist_ok=True)
    mine = [s for i, s in enumerate(seeds) if i % count == index]
    for setting_name in protocol["settings"]:
        shared = protocol.get("shared_runs", {}).get(setting_name, {})
        path = out / "runs" / f"{setting_name}.shard{index}of{count}.jsonl"
        for arm in protocol["arms"]:
            if arm in shared:
                continue
            start, ran = time.perf_counter(), 0
            for seed in mine:
                if (setting_name, arm, seed) in done:
                    continue
                record = {**header, **run_one(protocol, setting_name, arm, seed)}
                with path.open("a") as f:  # one line per finished run: a kill loses at most the run in flight
                    f.write(json.dumps(record, separators=(",", ":")) + "\n")
                ran += 1
            log(f"{setting_name}/{arm}: {ran} runs in {time.perf_counter() - start:.0f}s")


# What a run's curve depends on: the testbed and the project's own estimator code it calls.
TESTBED_PATHS = ("ibpo_lit/experiments/exact_gradient", "ibpo_lit/algorithms")


def code_of_runs(records: list[dict]) -> dict:
    """Which code the runs ran: a factorial resumed over several sessions spans commits. Each commit
    (in order of first appearance) with its number of runs and of runs made with uncommitted
    testbed changes, and whether ``TESTBED_PATHS`` are identical at all of them (``git diff``)."""
    commits: dict[str, list[int]] = {}
    for r in records:
        counts = commits.setdefault(r["code_commit"], [0, 0])
        counts[0] += 1
        counts[1] += bool(r.get("code_dirty"))
    first, *others = list(commits) or [None]
    same = all(subprocess.run(["git", "diff", "--quiet", first, other, "--", *TESTBED_PATHS], cwd=ROOT).returncode == 0
               for other in others)
    return {"commits": [[c, n, dirty] for c, (n, dirty) in commits.items()], "testbed_identical": same}


# ---------------------------------------------------------------------- endpoints and statistics
def cost_axis(record: dict, axis: str, length: int) -> list[float]:
    """The run's cumulative cost before each point of its curve: sequences, or context tokens
    in GSPO's sequence-equivalents (tokens / (1 + T))."""
    if axis == "sequences":
        return record["sequences"]
    return [tokens / (1 + length) for tokens in record["context_tokens"]]


def mean_over(curve: list[float], axis: list[float], budget: float) -> float:
    """``(1/budget) * integral_0^budget J(s) ds`` of the step function ``J(s) = curve[i]`` for
    ``axis[i] <= s < axis[i+1]`` (the J a run holds after spending s): the area under J,
    normalised. The run must have reached ``budget``."""
    if axis[0] != 0 or axis[-1] < budget:
        raise ValueError(f"the curve covers [{axis[0]}, {axis[-1]}], not [0, {budget}]")
    area = 0.0
    for i, value in enumerate(curve):
        if axis[i] >= budget:
            break
        end = min(axis[i + 1], budget) if i + 1 < len(axis) else budget
        area += value * (end - axis[i])
    return area / budget


def endpoint(record: dict, spec: dict, axis: str, length: int) -> float:
    costs = cost_axis(record, axis, length)
    if spec["kind"] == "value_at":
        if costs[-1] < spec["budget"]:
            raise ValueError(f"run {record['setting']}/{record['arm']}/{record['seed']} did not reach {spec['budget']}")
        return value_at_budget(record["curve"], costs, spec["budget"])
    if spec["kind"] == "mean_over":
        return mean_over(record["curve"], costs, spec["budget"])
    raise ProtocolError(f"unknown endpoint kind {spec['kind']!r}")


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values: sorted ascending, the i-th (from 0) of m is
    multiplied by m - i, then made non-decreasing and capped at 1. Written here (8 lines)
    because statsmodels, which has it, is not installed, and scipy's
    ``false_discovery_control`` covers only Benjamini-Hochberg/-Yekutieli."""
    m = len(p_values)
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def paired_p(values: list[float]) -> float:
    """Two-sided one-sample t-test of the per-seed contrasts against 0 (the test matching the
    t-interval). All values equal: scipy gives NaN; no spread and a mean of 0 is p = 1, no spread
    and any other mean p = 0."""
    from scipy import stats

    if max(values) == min(values):
        return 1.0 if values[0] == 0 else 0.0
    return float(stats.ttest_1samp(values, 0.0).pvalue)


def runs_by_arm(protocol: dict, records: list[dict]) -> dict:
    """``{(setting, arm): {seed: record}}``, shared arms filled from the setting they share."""
    table: dict = {}
    for r in records:
        table.setdefault((r["setting"], r["arm"]), {})[r["seed"]] = r
    for setting_name, shared in (protocol.get("shared_runs") or {}).items():
        for arm, source in shared.items():
            table[(setting_name, arm)] = table.get((source, arm), {})
    return table


def analyze(protocol: dict, records: list[dict]) -> dict:
    """Every row of the family (setting x contrast x endpoint, the protocol's order), the Holm
    adjustment over the rows that have data, and the arms' own endpoint values."""
    table = runs_by_arm(protocol, records)
    alpha = protocol["inference"]["familywise_alpha"]
    size = protocol["inference"]["family_size"]
    rows = []
    for setting_name in protocol["settings"]:
        length = setting(protocol, setting_name)["length"]
        for contrast_name, contrast in protocol["contrasts"].items():
            arms = contrast["weights"]
            seeds = sorted(set.intersection(*(set(table.get((setting_name, a), {})) for a in arms)))
            for endpoint_name, spec in protocol["endpoints"].items():
                row = {"setting": setting_name, "contrast": contrast_name, "endpoint": endpoint_name,
                       "axis": contrast["axis"], "seeds": len(seeds)}
                if len(seeds) >= 2:
                    values = [sum(w * endpoint(table[(setting_name, a)][s], spec, contrast["axis"], length)
                                  for a, w in arms.items()) for s in seeds]
                    row["estimate"], *row["ci95"] = t_interval(values, 0.95)
                    row["ci_family"] = list(t_interval(values, 1 - alpha / size)[1:])
                    row["p"] = paired_p(values)
                rows.append(row)
    tested = [r for r in rows if "p" in r]
    for r, adjusted in zip(tested, holm([r["p"] for r in tested])):
        r["p_holm"] = adjusted
        r["reject"] = adjusted < alpha
    arm_values = []
    for (setting_name, arm), runs in sorted(table.items()):
        if len(runs) < 2:
            continue
        length = setting(protocol, setting_name)["length"]
        for endpoint_name, spec in protocol["endpoints"].items():
            for axis in ("sequences", "context_tokens"):
                values = [endpoint(r, spec, axis, length) for r in runs.values()]
                arm_values.append({"setting": setting_name, "arm": arm, "endpoint": endpoint_name, "axis": axis,
                                   "seeds": len(values), "value": list(t_interval(values, 0.95)),
                                   "seconds_mean": sum(r["seconds"] for r in runs.values()) / len(runs)})
    return {"family_size": size, "tested": len(tested), "complete": len(tested) == size and
            all(r["seeds"] == protocol["seeds"]["count"] for r in rows), "rows": rows, "arms": arm_values}


# ---------------------------------------------------------------------- the report
def _f(x, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.{digits}f}"


def _p(x) -> str:
    return "-" if x is None else f"{x:.2g}"


def report_text(protocol: dict, result: dict, header: dict) -> str:
    alpha, size = protocol["inference"]["familywise_alpha"], result["family_size"]
    lines = ["# Pre-registered exact-gradient factorial: every endpoint", "",
             f"Generated by `scripts/exact_gradient_factorial.py` from the run records beside it. Protocol "
             f"`protocol.yaml` at commit `{header['protocol_commit']}` (sha256 `{header['protocol_sha256'][:16]}`); "
             f"report written at code `{header['code_commit'][:12]}`"
             f"{' (with uncommitted testbed changes)' if header['code_dirty'] else ''}.", ""]
    runs = result.get("runs_code")
    if runs and runs["commits"]:
        made = ", ".join(f"{n:,} at `{c[:12]}`" + (f" ({dirty:,} of them with uncommitted testbed changes)" if dirty else "")
                         for c, n, dirty in runs["commits"])
        lines += [f"Runs made at code: {made}; the testbed (`{'`, `'.join(TESTBED_PATHS)}`) is "
                  + ("identical at all of them." if runs["testbed_identical"] else "**not** identical at all of them "
                     "(`git diff` differs): the runs are not all of one code.") , ""]
    if result["complete"]:
        lines.append(f"All {size} tests of the family, {protocol['seeds']['count']} seeds each, Holm at a "
                     f"family-wise {alpha}.")
    else:
        lines.append(f"**Incomplete**: {result['tested']} of the family's {size} tests have data, not all with "
                     f"{protocol['seeds']['count']} seeds; the Holm column adjusts over those {result['tested']} only "
                     "and is not the pre-registered adjustment until every row is there.")
    lines += ["", "Estimate: mean over seeds of the per-seed contrast (paired by seed); `95% CI`: Student t, one "
              f"comparison; `family CI`: Bonferroni at 1 - {alpha}/{size} (simultaneous); `p`: two-sided paired t; "
              f"`p Holm`: Holm-adjusted over the family; `reject`: p Holm < {alpha}. Endpoints on the contrast's axis "
              "(sequences, or context tokens in GSPO's sequence-equivalents).", "",
              "| setting | contrast | endpoint | axis | seeds | estimate | 95% CI | family CI | p | p Holm | reject |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        if "p" not in r:
            lines.append(f"| {r['setting']} | {r['contrast']} | {r['endpoint']} | {r['axis']} | {r['seeds']} | "
                         "not run | - | - | - | - | - |")
            continue
        lines.append(f"| {r['setting']} | {r['contrast']} | {r['endpoint']} | {r['axis']} | {r['seeds']} | "
                     f"{_f(r['estimate'])} | [{_f(r['ci95'][0])}, {_f(r['ci95'][1])}] | "
                     f"[{_f(r['ci_family'][0])}, {_f(r['ci_family'][1])}] | {_p(r['p'])} | {_p(r['p_holm'])} | "
                     f"{'yes' if r['reject'] else 'no'} |")
    lines += ["", "## Each arm's endpoints (mean and 95% t-interval over seeds; not part of the family)", "",
              "| setting | arm | endpoint | axis | seeds | value | s / run |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for a in result["arms"]:
        v = a["value"]
        lines.append(f"| {a['setting']} | {a['arm']} | {a['endpoint']} | {a['axis']} | {a['seeds']} | "
                     f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}] | {a['seconds_mean']:.2f} |")
    return "\n".join(lines) + "\n"


def report(protocol: dict, out: Path, header: dict) -> str:
    records = read_records(out, header["protocol_commit"])
    result = {**analyze(protocol, records), "runs_code": code_of_runs(records)}
    if result["complete"] and any((out / "runs").glob("*.jsonl")):
        pack_records(out, records)
    text = report_text(protocol, result, header)
    (out / "report.md").write_text(text)
    tmp = out / f"results.json.{os.getpid()}.tmp"  # two shards may finish together
    tmp.write_text(json.dumps({**header, **result}, indent=1))
    os.replace(tmp, out / "results.json")
    log(f"wrote {out / 'report.md'} ({result['tested']} of {result['family_size']} tests)")
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", default=str(PROTOCOL), help="the committed protocol (YAML)")
    parser.add_argument("--out", default=None, help=f"default {OUT} ({OUT}/quick with --quick)")
    parser.add_argument("--shard", default="0/1", help="i/n: run the seeds with index %% n == i")
    parser.add_argument("--report", action="store_true", help="only write report.md and results.json")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: the first {QUICK_SEEDS} seeds")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    header = stamp(Path(args.protocol))  # refuses an uncommitted or changed protocol, before anything else
    protocol = load_protocol(Path(args.protocol))
    out = Path(args.out) if args.out else (OUT / "quick" if args.quick else OUT)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    index, count = (int(x) for x in args.shard.split("/"))
    if not 0 <= index < count:
        raise SystemExit(f"--shard {args.shard}: need 0 <= i < n")
    if not args.report:
        log(f"protocol {header['protocol_commit'][:12]}, shard {index}/{count}, out {out}")
        run(protocol, out, seeds_of(protocol, args.quick), (index, count), header)
    report(protocol, out, header)


if __name__ == "__main__":
    main()
