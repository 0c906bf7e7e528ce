"""The numbers the pages quote, recomputed from the per-run files under results/ with the code
that made them (tests/docs/test_quoted_numbers.py says which file each comes from). JSON and logs
only: no model, no training."""
from __future__ import annotations

import glob
import json
import math
import re
import statistics
from functools import cache
from pathlib import Path
from typing import Sequence

import numpy as np

from quote_checks import REPO

RESULTS = REPO / "results"
POWER, POWER2, STRICT, CIW = "compare_smollm2_power", "compare_smollm2_power2", "compare_smollm2_strict", "compare_ciw"
LAMBDA = "lambda_shaping"  # issue 46 item 3: lambda_0.6 against lambda_0, the problem stream varied by seed
# Where each number comes from, as the failure messages name it.
S_P2 = f"results/{POWER2}/summary.json"
S_P = f"results/{POWER}/summary.json"
S_ST = f"results/{STRICT}/summary.json"
S_ALL = "results/*/summary.json"
S_VAR = "results/variance/untrained.json, gspo_checkpoint.json"
S_BENCH = "results/bench_throughput/**/*.json"
S_EG = "results/exact_gradient/fixed.json, curves.json"
S_FACT = "results/exact_gradient_factorial/runs.jsonl.xz"
S_CR = "results/correction_regime/arith*.json"
S_QS = "results/quickstart_precision/native_auto.log"
S_PRE = "results/pre_fix/*/summary.json"
S_CIW = f"results/{CIW}/summary.json"
S_LAM = f"results/{LAMBDA}/summary.json"
# The sections of docs/results.md and docs/benchmarks.md the quotes lie in.
KNOWN = "What is known, what is not, and why"
QUICK = "The quick-start run (SmolLM2-135M on the CPU)"
AB = "The compute-matched A/B (METHOD section 6)"
HACK = "Found here: a reward hack"
POWER_SEC = "The A/B's validation with power (250 problems x 4 samples)"
POWER2_SEC = "Second sample: seeds 3 and up, the budget without diagnostic forwards"
VAR = "Policy-gradient variance at a fixed policy"
TABLES = "The papers' tables (`scripts/report.py`)"
CIW_SEC = "CIW on SmolLM2"
LAMBDA_SEC = "Shaping alone on SmolLM2: lambda = 0 against 0.6 (pre-registered)"
BOTH = ("untrained", "gspo_checkpoint")
SPEED = "Speed against TRL"


def result_json(path: str):
    with open(RESULTS / path) as f:
        return json.load(f)


@cache
def comparison(name: str) -> tuple[dict, ...]:
    """The run summaries of ``results/<name>/summary.json``, as ``scripts/report.py`` reads them."""
    from ibpo_lit.experiments.runs import read_comparison

    return tuple(read_comparison(str(RESULTS / name / "summary.json")))


def arm_runs(name: str, arm: str) -> list[dict]:
    return sorted((r for r in comparison(name) if r["arm"] == arm), key=lambda r: r["seed"])


def paired(name: str, arm: str, reference: str, key: str = "final_val") -> tuple[float, float, float, int]:
    """``arm - reference`` of ``key``, paired t over the seeds both ran: (mean, low, high, n)."""
    from ibpo_lit.evaluation.bootstrap import paired_t_interval
    from ibpo_lit.experiments.cells import paired_values

    a, b = paired_values(arm_runs(name, arm), arm_runs(name, reference), lambda r: r.get(key))
    return (*paired_t_interval(a, b), len(a))


def final_eval_diff(name: str) -> tuple[float, float, float, int]:
    """IBPO minus GSPO (G = 32) on the final evaluation, paired by seed and problem, as
    ``experiments.final_eval.paired_difference`` computes it: a run's ``final_eval`` is its mean
    over the problems, so each seed's mean difference over the same problems is the difference of
    the two, and the t-interval is over the seeds. (Importing final_eval loads Lightning, 10-30 s
    here, for one subtraction.)"""
    return paired(name, "ibpo_plain", "gspo_large_group", "final_eval")


def seed_t(name: str, arm: str, key: str) -> tuple[float, float, float]:
    from ibpo_lit.evaluation.bootstrap import t_interval

    return t_interval([r[key] for r in arm_runs(name, arm)])


def clipped(interval: Sequence[float]) -> list[float]:
    """An interval of a share clipped to [0, 1], as the tables print it."""
    return [min(max(v, 0.0), 1.0) for v in interval]


def all_summaries() -> list[dict]:
    out = []
    for path in sorted(glob.glob(str(RESULTS / "*" / "summary.json"))):
        try:
            out += comparison(Path(path).parent.name)
        except ValueError:  # results/bench_throughput/summary.json is no comparison
            pass
    return out


def report_pairs() -> list[tuple[str, float, float, float, float, float]]:
    """Each paired difference the report shows: (label, mean, low, high, Bonferroni low, high)."""
    from ibpo_lit.evaluation.bootstrap import paired_t_interval
    from ibpo_lit.experiments.tables import paired_comparisons

    pairs = paired_comparisons(all_summaries())
    strict = 1 - 0.05 / len(pairs)
    return [(f"{p['arm']} - {p['reference']}", *paired_t_interval(p["a"], p["b"]),
             *paired_t_interval(p["a"], p["b"], strict)[1:]) for p in pairs]


def excluding_zero(pairs) -> list:
    return [p for p in pairs if p[2] > 0 or p[3] < 0]


def mean_ratio(name: str, key: str, num: str, den: str) -> float:
    """Mean of ``key`` over ``num``'s runs over its mean over ``den``'s (the seeds both ran)."""
    seeds = {r["seed"] for r in arm_runs(name, num)} & {r["seed"] for r in arm_runs(name, den)}
    mean = lambda arm: statistics.fmean(r[key] for r in arm_runs(name, arm) if r["seed"] in seeds)  # noqa: E731
    return mean(num) / mean(den)


def response_len(name: str, arm: str, at: int) -> list[float]:
    return [r["series"]["train/response_len"][at][1] for r in arm_runs(name, arm)]


@cache
def variance(which: str) -> dict:
    return result_json(f"variance/{which}.json")


def squared_rows_ratio(which: str) -> float:
    """What dividing by IBPO's rows alone does to the trace: (GSPO's rows / IBPO's rows)^2."""
    res = variance(which)["results"]
    return (res["gspo"]["rows_per_batch"] / res["ibpo_plain"]["rows_per_batch"]) ** 2


@cache
def exact_fixed() -> dict:
    return result_json("exact_gradient/fixed.json")


def fixed_ratio(key: str) -> list[float]:
    """``ibpo_plain`` over GSPO at the three fixed-policy states."""
    return [next(r for r in rows if r["method"] == "ibpo_plain")["vs_gspo"][key][0]
            for rows in exact_fixed()["rows"].values()]


@cache
def exact_curves() -> dict:
    return result_json("exact_gradient/curves.json")


def stored_curve_summary(label: str, baseline: str) -> dict:
    """A learning-curve row as the script computed it before rounding the saved curves."""
    d = exact_curves()
    return next(s for s in d["summaries"] + d["matched_summaries"] + d["sweep_summaries"]
                if s["label"] == label and s["baseline"] == baseline)


@cache
def curve_contrast(label: str, baseline: str) -> dict:
    """A contrast the script did not store, from the per-seed curves (saved to 5 decimals)."""
    from ibpo_lit.experiments.exact_gradient.experiment import summarize_curves

    return summarize_curves([{"label": label, "baseline": baseline}], exact_curves()["runs"])[0]


def curve_comparisons() -> int:
    """Learning-curve rows against another config (a config against itself is all zeros)."""
    d = exact_curves()
    return sum(s["label"] != s["baseline"] for s in d["summaries"] + d["matched_summaries"] + d["sweep_summaries"])


@cache
def correction_rates(task: str) -> dict:
    """Wrong samples and how many the oracle correction fixed, per problem with a correct sample
    (IBPO's case), as ``results/correction_regime/summarize.py`` counts them."""
    result = result_json(f"correction_regime/{task}.json")
    fixed, wrong = [], []
    for p in result["problems"]:
        bad = [i for i, s in enumerate(p["scores"]) if s != 1.0]
        if p["n_correct"] > 0 and bad:
            fixed.append(sum(1 for i in bad if p["ttc_oracle_scores"][i] == 1.0))
            wrong.append(len(bad))
    return {"fixed": fixed, "wrong": wrong, "problems": result["n_problems"], "k": result["k"]}


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    from scipy.stats import beta

    return float(beta.ppf(0.025, k, n - k + 1)), float(beta.ppf(0.975, k + 1, n - k))


def by_problem_interval(fixed: Sequence[int], wrong: Sequence[int]) -> tuple[float, float, float]:
    """The ratio sum(fixed) / sum(wrong) with the problem as the unit: its linearised standard
    error over the n problems (a cluster-robust ratio estimate) and t on n - 1 degrees of freedom.
    Only docs/results.md quotes it, so this is its one home."""
    from ibpo_lit.evaluation.bootstrap import t_quantile

    f, w = np.asarray(fixed, float), np.asarray(wrong, float)
    n, ratio = f.size, f.sum() / w.sum()
    se = math.sqrt(n / (n - 1) * float(np.sum((f - ratio * w) ** 2))) / w.sum()
    half = t_quantile(0.95, n - 1) * se
    return ratio, ratio - half, ratio + half


@cache
def throughput_runs() -> tuple[tuple[str, dict], ...]:
    """Every throughput run on file: (path under results/bench_throughput/, its JSON)."""
    root = RESULTS / "bench_throughput"
    return tuple((str(Path(p).relative_to(root)), json.loads(Path(p).read_text()))
                 for p in sorted(glob.glob(str(root / "**" / "*.json"), recursive=True)))


SPEED_ARMS = ("ibpo-hf", "ibpo-vllm", "ibpo-vllm-bf16engine")


def rows_mode(run: dict, row: dict) -> str:
    """Which rows an ibpo-lit arm trained: "skip" (ibpo-lit's default, zero-advantage rows not
    trained) or "every" (every row, as TRL does). Runs made before the script recorded
    ``every_row`` in their settings ran the default only, under the arm's bare name; since then the
    bare name is the every-row arm and the default is ``<arm> (skip)``."""
    return "every" if "every_row" in run["settings"] and not row["arm"].endswith(" (skip)") else "skip"


def speed_rows(arm: str, mode: str = "skip") -> list[tuple[str, dict]]:
    """The arm's rows that README's medians take (``mode`` "skip", ibpo-lit as it runs by default)
    or its same-work figure takes ("every"): fp32 trainer, eager engine, a TRL arm in the same run
    (so a per-token ratio exists)."""
    return [(path, row) for path, run in throughput_runs() if not run["settings"].get("vllm_compile")
            for row in run["rows"] if row["arm"].removesuffix(" (skip)") == arm and rows_mode(run, row) == mode
            and row["precision"] == "fp32" and row.get("tok_ratio")]


def speed_median(arm: str) -> float:
    return statistics.median(row["tok_ratio"] for _, row in speed_rows(arm))


def speed_range(arm: str) -> list[float]:
    ratios = [row["tok_ratio"] for _, row in speed_rows(arm)]
    return [min(ratios), max(ratios)]


def speed_arm_runs() -> list[dict]:
    return [row for arm in SPEED_ARMS for _, row in speed_rows(arm)]


def speed_files() -> set[str]:
    return {path for arm in SPEED_ARMS for path, _ in speed_rows(arm)}


def speed_cell(path: str, arm: str) -> list[float]:
    row = next(r for p, r in speed_rows(arm) if p == path)
    return [row["tok_ratio"], 100 * row["zero_adv_frac"]]


def run_of(path: str) -> dict:
    return dict(throughput_runs())[path]


def trl_step(path: str) -> float:
    return next(r["s_per_step"] for r in run_of(path)["rows"] if r["arm"] == "trl" and r["precision"] == "fp32")


def quickstart_steps() -> list[tuple[float, float]]:
    """(reward, seconds) of each step line of the quick start's bf16 log."""
    text = (RESULTS / "quickstart_precision" / "native_auto.log").read_text()
    return [(float(m[1]), float(m[2])) for m in re.finditer(r"^step \d+/\d+\s+reward (\S+) .*?(\S+) s$", text, re.M)]


def p2_final() -> list[float]:
    """The main A/B: IBPO minus GSPO (G = 32) on 250 x 4, the second sample (mean, low, high, n)."""
    return list(final_eval_diff(POWER2))


def speed_bullet() -> list[float]:
    return [speed_median("ibpo-hf"), len(speed_rows("ibpo-hf")), *speed_range("ibpo-hf"),
            speed_median("ibpo-vllm"), len(speed_rows("ibpo-vllm")), *speed_range("ibpo-vllm"),
            speed_median("ibpo-vllm-bf16engine"), len(speed_rows("ibpo-vllm-bf16engine")),
            *sorted(r["tok_ratio"] for _, r in speed_rows("ibpo-vllm-bf16engine"))]


def zero_adv() -> list[float]:
    skipped = [r for r in speed_arm_runs() if r["zero_adv_frac"] > 0]
    shares = {round(100 * r["zero_adv_frac"]) for r in skipped}
    assert len(shares) == 1, f"the arms skipped different shares of rows: {sorted(shares)}; say so"
    return [shares.pop(), len(skipped), len(speed_arm_runs())]


def bench_settings(key: str) -> set:
    """The values of one workload setting over every throughput run."""
    return {run["settings"][key] for _, run in throughput_runs()}


def one(values: set) -> float:
    """The one value every run shares (a page that quotes one number for all of them)."""
    assert len(values) == 1, f"the runs differ: {sorted(values)}"
    return next(iter(values))


def budgets(name: str) -> set[str]:
    return {re.search(r"--budget-flops (\S+)", r["command"]).group(1) for r in comparison(name)}


def curve_steps(label: str, baseline: str, stored: bool = True) -> list[float]:
    record = stored_curve_summary(label, baseline) if stored else curve_contrast(label, baseline)
    return record["target_0.8"]["steps_diff"]


def curve_j150(label: str, baseline: str) -> list[float]:
    return curve_contrast(label, baseline)["J_at_step"]["150"]["diff"]


def t_multiplier(seeds: int) -> float:
    from ibpo_lit.evaluation.bootstrap import t_quantile

    return t_quantile(0.95, seeds - 1)


def bootstrap(values: list[float]) -> tuple[float, float, float]:
    from ibpo_lit.evaluation.bootstrap import bootstrap_ci

    return bootstrap_ci(values)


def partnered(task: str) -> dict:
    """IBPO's case on one task: wrong samples (``wrong``) of the problems with a correct sample
    (``partners`` of them), how many the correction fixed (``fixed``, ``rate`` in %), the
    task's ``problems`` and samples a problem (``k``)."""
    c = correction_rates(task)
    fixed, wrong = sum(c["fixed"]), sum(c["wrong"])
    return {"fixed": fixed, "wrong": wrong, "rate": 100 * fixed / wrong, "partners": len(c["fixed"]),
            "problems": c["problems"], "k": c["k"]}


def per_seed_final(name: str, arm: str) -> list[tuple[float, float, float]]:
    """Each run's final evaluation with its t-interval over the problems."""
    from ibpo_lit.evaluation.bootstrap import t_interval

    return [t_interval(np.asarray(r["final_eval_correct"]) / r["final_eval_k"]) for r in arm_runs(name, arm)]


def per_seed_diffs(name: str, arm: str = "ibpo_plain", reference: str = "gspo_large_group") -> list[float]:
    """Each seed's ``arm`` minus ``reference`` on the final evaluation (by default IBPO minus GSPO
    with G = 32; see ``final_eval_diff``)."""
    ref = {r["seed"]: r["final_eval"] for r in arm_runs(name, reference)}
    return [r["final_eval"] - ref[r["seed"]] for r in arm_runs(name, arm)]


def half_width(sd: float, n: int) -> float:
    return t_multiplier(n) * sd / math.sqrt(n)


def pairs_for(half: float, sd: float) -> int:
    """The fewest pairs whose paired t-interval is at most ``half`` wide at this spread."""
    return next(n for n in range(2, 1000) if half_width(sd, n) <= half)


def pre_fix() -> list[dict]:
    return [r for c in ("compare_smollm2", "compare_ciw") for r in comparison(f"pre_fix/{c}")]


HACKED = [("shaping_only", "compare_smollm2", 1), ("shaping_only", "compare_smollm2", 2), ("gspo", "compare_ciw", 2),
          ("gspo_large_group", "compare_smollm2", 2), ("gspo_ciw_inverted", "compare_ciw", 2)]


def pre_fix_run(arm: str, comp: str, seed: int) -> dict:
    return next(r for r in comparison(f"pre_fix/{comp}") if r["arm"] == arm and r["seed"] == seed)


def hack_row(arm: str, comp: str, seed: int) -> list[float]:
    r = pre_fix_run(arm, comp, seed)
    return [r["final_val"], r["series"]["train/response_len"][0][1], r["series"]["train/response_len"][-1][1]]


def unhacked_runs() -> list[dict]:
    hacked = {(a, f"results/pre_fix/{c}", s) for a, c, s in HACKED}
    return [r for r in pre_fix() if (r["arm"], str(Path(r["comparison"]).relative_to(REPO)), r["seed"]) not in hacked]


def var_method(which: str, method: str) -> dict:
    return variance(which)["results"][method]


def var_vs(which: str, method: str) -> dict:
    return variance(which)["vs_baseline"][method]


def prompt_batches(which: str) -> int:
    """Prompts x batches of a variance measurement."""
    return var_method(which, "gspo")["prompts"] * var_method(which, "gspo")["batches"]


def gradient_batches(which: str, method: str) -> int:
    """Prompt-batches whose gradient part is not zero (some rollout differs from its group)."""
    cross = var_method(which, method)["prompt_cross_grams"]
    return sum(cross[p][p][m][m] > 0 for p in range(len(cross)) for m in range(len(cross[p][p])))


def old_variance(which: str) -> dict:
    return result_json(f"variance/2026-11-24/{which}.json")["vs_baseline"]["ibpo_plain"]


def strict_t(arm: str, key: str) -> list[float]:
    return list(seed_t(STRICT, arm, key))


def grad_var_ratio(name: str, arm: str, baseline: str) -> list[float]:
    from ibpo_lit.evaluation.bootstrap import log_t_interval
    from ibpo_lit.experiments.cells import paired_ratios

    return list(log_t_interval(paired_ratios(arm_runs(name, arm), arm_runs(name, baseline), "grad_var_trace")))


def rewrite_rate(arm: str, seed: int) -> float:
    r = next(r for r in arm_runs(STRICT, arm) if r["seed"] == seed)
    return statistics.fmean(v for _, v in r["series"]["train/rewrite_rate"])


def same_run(arms: Sequence[str], seed: int) -> bool:
    """Every logged series but the clock is equal across ``arms`` at ``seed``."""
    runs = [next(r for r in arm_runs(STRICT, a) if r["seed"] == seed)["series"] for a in arms]
    keep = lambda s: {k: v for k, v in s.items() if k != "compute/device_seconds"}  # noqa: E731
    return all(keep(s) == keep(runs[0]) for s in runs[1:])


def peak_over_median(arm: str) -> float:
    """The largest single gradient-variance measurement over its run's median, over the arm's runs."""
    return max(max(v for _, v in r["series"]["grad_var/trace"]) / statistics.median(v for _, v in r["series"]["grad_var/trace"])
               for r in arm_runs(STRICT, arm))


def rendered_report() -> str:
    """The report scripts/report.py --doc writes, rendered from every results/*/summary.json now
    (run from the repository: the tables name each comparison by its folder, relative to it)."""
    from ibpo_lit.experiments.runs import read_comparison
    from ibpo_lit.experiments.tables import REPORT_TABLES, report_markdown, row_runs

    summaries = []
    for path in sorted(glob.glob("results/*/summary.json")):
        try:
            summaries += read_comparison(path)
        except ValueError:  # a benchmark's summary.json
            pass
    images = {spec.name: f"../results/report/{spec.name}.png" for spec in REPORT_TABLES
              if any(runs for _, _, runs in row_runs(spec, summaries))}
    return report_markdown(summaries, images).strip()


def generated_block(text: str) -> str:
    """The text between the report markers, without the line saying it is generated."""
    from ibpo_lit.experiments.readme_block import END, START

    block = text[text.index(START) + len(START):text.index(END)].strip()
    first, _, rest = block.partition("\n")
    return rest.strip() if "generated by scripts/report.py" in first else block


# (file, what the row calls it, date): no result file records its date; it is the commit's that added it.
SPEED_RUNS = [("summary.json", " (its fp32 arms)", "2026-11-21"), ("fp32_bf16engine.json", "", "2026-11-21"),
              ("fp32_after_scale.json", "", "2026-11-24"),
              ("issue33/before_103b4bf.json", " (the tree of commit 103b4bf)", "2026-11-26"),
              ("issue33/after.json", "", "2026-11-26"),
              ("issue45/same_rows_hf.json", " (`ibpo-hf (skip)`)", "2026-11-27"),
              ("issue45/same_rows_hf_vllm.json", " (the `(skip)` arms)", "2026-11-28")]


def other_setup(path: str, arm: str, precision: str) -> float:
    return next(r["tok_ratio"] for r in run_of(path)["rows"] if r["arm"] == arm and r["precision"] == precision)




def same_work(arm: str) -> list[float]:
    """The arm's every-row runs (the same rows trained as TRL's): the median over its runs on file
    of the speed-up per generated token, per step and per trained token, then the count of runs."""
    rows = [row for _, row in speed_rows(arm, "every")]
    assert rows, f"no same-work run of {arm} on file"
    return [statistics.median(row[key] for row in rows) for key in ("tok_ratio", "speedup", "token_speedup")] + [len(rows)]


# ------------------------------------------------------------------ the pre-registered factorial
FACTORIAL_CONTRASTS = ("shaping_given_training", "training_given_shaping", "shaping_without_training",
                       "training_without_shaping", "interaction")  # the 2 x 2's own, beside the GSPO ones


@cache
def factorial() -> dict:
    """The factorial's 126 tests recomputed from its raw run records (the packed file git keeps,
    not report.md or results.json), by the script's own analysis, which
    tests/scripts/test_exact_gradient_factorial.py checks on hand-computed cases."""
    import importlib.util
    import lzma
    import sys

    path = REPO / "scripts" / "exact_gradient_factorial.py"
    spec = importlib.util.spec_from_file_location("exact_gradient_factorial_docs", path)
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script
    spec.loader.exec_module(script)
    with lzma.open(REPO / S_FACT, "rt") as f:
        records = [json.loads(line) for line in f if line.strip()]
    commit = script.protocol_commit(script.PROTOCOL)
    assert {r["protocol_commit"] for r in records} == {commit}, "the packed runs are of another protocol commit"
    protocol = script.load_protocol(script.PROTOCOL)
    result = script.analyze(protocol, sorted(records, key=lambda r: (r["setting"], r["arm"], r["seed"])))
    assert result["complete"], "the factorial on file is not complete"
    return result


def fact_rows(contrast: str = "", setting: str = "", endpoint: str = "") -> list[dict]:
    return [r for r in factorial()["rows"] if (not contrast or r["contrast"] == contrast)
            and (not setting or r["setting"] == setting) and (not endpoint or r["endpoint"] == endpoint)]


def fact_rejects(contrast: str = "", setting: str = "", endpoint: str = "") -> int:
    return sum(r["reject"] for r in fact_rows(contrast, setting, endpoint))


def fact_estimates(contrast: str, endpoint: str, rejected: bool = True) -> list[float]:
    """The estimates of the contrast's tests of one endpoint that reject (or all of them)."""
    return [r["estimate"] for r in fact_rows(contrast, endpoint=endpoint) if r["reject"] or not rejected]


def lambda_diff() -> tuple[float, float, float, int]:
    """The lambda experiment's primary endpoint: ``lambda_0.6 - lambda_0`` on the final
    evaluation, paired by seed and problem (see ``final_eval_diff``), t over the seeds."""
    return paired(LAMBDA, "lambda_0.6", "lambda_0", "final_eval")


def lambda_gain(arm: str) -> tuple[float, float, float]:
    """An arm's final evaluation over the untrained model's (``baseline_eval``), t over the seeds."""
    from ibpo_lit.evaluation.bootstrap import t_interval

    return t_interval([r["final_eval"] - r["baseline_eval"] for r in arm_runs(LAMBDA, arm)])
