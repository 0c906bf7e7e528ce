"""The report's tables on hand-made summaries: exact cells, seed pairing, marks and layout."""
import pytest

import math

from ibpo_lit.evaluation.bootstrap import combine_runs, log_t_interval, t_interval
from ibpo_lit.experiments.cells import ci_cell, difference_cell, paired_ratios, ratio_cell, seeds_label
from ibpo_lit.experiments.tables import (
    GRAD_VAR_BASELINES,
    REPORT_TABLES,
    as_combined,
    eval_tables,
    multiplicity_note,
    paired_comparisons,
    report_markdown,
    table_markdown,
    table_rows,
)

T2 = 4.302652729749462  # t_{2, 0.975}

SPECS = {spec.name: spec for spec in REPORT_TABLES}


def run(arm, seed, comparison="results/a", **values):
    base = {"arm": arm, "seed": seed, "comparison": comparison, "steps": 4, "flops": 2e12,
            "baseline_val": 0.25, "final_val": 0.5, "final_reward": 0.5, "grad_var_trace": 1.0}
    return {**base, **values}


def cell(values, fmt="{:.3f}", interval=t_interval):
    mean, low, high = interval(values)
    return f"{fmt.format(mean)} [{fmt.format(low)}, {fmt.format(high)}]"


def row(table, label):
    return next(line for line in table.splitlines() if line.startswith(f"| {label} |"))


def test_cells_skip_missing_values_and_pair_only_shared_seeds():
    assert ci_cell([None, float("nan")], "{:.3f}") == "-"
    assert ci_cell([0.5, None], "{:.3f}") == "0.500"  # one value: no interval
    assert ci_cell([0.5, 0.5, 0.5], "{:.3f}") == "0.500 (all equal)"  # no spread seen: no zero-width interval
    # 0.0, 0.1, 0.2: 0.1 -+ 4.3027 * 0.1 / sqrt(3) = [-0.148, 0.348]; a share is clipped at 0
    assert ci_cell([0.0, 0.1, 0.2], "{:.3f}") == "0.100 [-0.148, 0.348]"
    assert ci_cell([0.0, 0.1, 0.2], "{:.3f}", bounds=(0.0, 1.0)) == "0.100 [0.000, 0.348]"
    runs = [{"seed": 0, "g": 1.0}, {"seed": 1, "g": 3.0}, {"seed": 2, "g": None}, {"seed": 3, "g": 2.0}]
    base = [{"seed": 0, "g": 2.0}, {"seed": 1, "g": 4.0}, {"seed": 2, "g": 1.0}, {"seed": 3, "g": 0.0}]
    # seed 2: no value, seed 3: zero baseline -> dropped; 1/2, 3/4 kept
    assert paired_ratios(runs, base, "g") == [0.5, 0.75]
    assert paired_ratios(runs, base[:1], "g") == [0.5]
    assert seeds_label("k1", 2) == "k1 *(n=2)*" and seeds_label("k1", 3) == "k1"


def test_difference_cells_pair_by_seed_and_fall_back_to_welch():
    value = lambda r: r["v"]  # noqa: E731
    arm = [{"seed": s, "v": v} for s, v in enumerate([0.248, 0.318, 0.374])]
    ref = [{"seed": s, "v": v} for s, v in enumerate([0.395, 0.373, 0.349])]
    # per seed -0.147, -0.055, +0.025: -0.059 -+ 4.3027 * 0.086070 / sqrt(3) = [-0.273, +0.155]
    assert difference_cell(arm, ref, value, "{:+.3f}") == "-0.059 [-0.273, +0.155]"
    # two shared seeds of three: the pairs are fewer than the row's seeds, and said so
    assert difference_cell(arm, ref[:2], value, "{:+.3f}", n_shown=3).endswith("*(n=2)*")
    # no seed shared: Welch's interval over the two arms' seeds, marked
    other = [{"seed": s + 10, "v": v} for s, v in enumerate([0.395, 0.373, 0.349])]
    assert difference_cell(arm, other, value, "{:+.3f}").endswith("*(Welch)*")
    assert difference_cell(arm[:1], ref, value, "{:+.3f}") == "-"  # one pair: nothing to say
    # ratios: geometric mean, t on the logs; 0.5 and 2 -> 1.00
    assert ratio_cell([0.5, 2.0], "{:.2f}").startswith("1.00 [")
    assert ratio_cell([], "{:.2f}") == "-"


def test_ablation_rows_hold_mean_and_t_interval_over_seeds():
    summaries = [
        run("gspo_large_group", 0, grad_var_trace=2.0), run("gspo_large_group", 1, grad_var_trace=4.0),
        run("gspo_large_group", 2, grad_var_trace=5.0),
        run("ibpo_plain", 0, final_val=0.2, grad_var_trace=1.0), run("ibpo_plain", 1, final_val=0.4, grad_var_trace=3.0),
        run("ibpo_plain", 2, final_val=0.6, grad_var_trace=5.0),
        run("k1", 0, final_val=0.3, correction_success_last=0.5), run("k1", 1, final_val=0.5, correction_success_last=0.25),
    ]
    rows = {r["label"]: r for r in table_rows(SPECS["ablations"], summaries)}
    titles = [c.title for c in SPECS["ablations"].columns]
    plain = dict(zip(titles, rows["ibpo_plain"]["cells"]))
    # final val 0.2, 0.4, 0.6: mean 0.400, sd 0.2, half width 4.3027 * 0.2 / sqrt(3) = 0.497 -> clipped at 0
    assert plain["val acc, end"] == "0.400 [0.000, 0.897]"
    # gain = final - 0.25 per seed: -0.05, 0.15, 0.35 -> mean +0.150
    assert plain["val gain vs step 0"] == cell([-0.05, 0.15, 0.35], "{:+.3f}")
    assert plain["val gain vs step 0"].startswith("+0.150 [")
    # grad var paired by seed: 1/2, 3/4, 5/5 -> geometric mean (0.5 * 0.75 * 1) ** (1/3) = 0.72
    assert plain["grad var / baseline"] == cell([0.5, 0.75, 1.0], "{:.2f}", log_t_interval)
    assert plain["grad var / baseline"].startswith("0.72 [")
    assert plain["TFLOP"] == "2.0 (all equal)"  # 2e12 FLOPs in every seed, shown in TFLOP
    # k1 - plain at seeds 0 and 1: 0.3 - 0.2, 0.5 - 0.4 = 0.1 twice: all equal
    assert dict(zip(titles, rows["k1"]["cells"]))["val acc - ref, paired"] == "+0.100 (all equal)"  # 2 pairs of 2 seeds
    assert plain["val acc - ref, paired"] == "reference"
    assert plain["corr. success, last 3"] == "-"  # never logged
    k1 = dict(zip(titles, rows["k1"]["cells"]))
    # 0.5, 0.25: 0.375 -+ 12.706 * 0.17678 / sqrt(2), clipped to [0, 1]
    assert rows["k1"]["n"] == 2 and k1["corr. success, last 3"] == "0.375 [0.000, 1.000]"
    # k1 keeps run()'s trace 1.0 at seeds 0 and 1: 1/2, 1/4
    assert k1["grad var / baseline"] == cell([0.5, 0.25], "{:.2f}", log_t_interval)
    assert rows["shaping_only"]["n"] == 0 and rows["shaping_only"]["cells"] == [""] * len(titles)


def test_markdown_marks_few_seeds_and_lists_arms_not_run():
    summaries = [run("ibpo_plain", s) for s in range(3)] + [run("k1", 0), run("k1", 1)]
    table = table_markdown(SPECS["ablations"], summaries, image="ablations.png")
    assert table.startswith("### Ablations (IBPO Table 3)")
    assert row(table, "ibpo_plain").startswith("| ibpo_plain | 3 | 0.500 (all equal) | reference | +0.250 (all equal) |")
    assert "(all equal): every seed gave the same value" in table
    assert "k1 - ibpo_plain" in table and "paired t-interval" in table
    assert row(table, "k1 *(n=2)*").startswith("| k1 *(n=2)* | 2 |")
    shown = [c for c in SPECS["ablations"].columns if not c.optional]  # no run has a final-eval
    assert row(table, "shaping_only") == "| shaping_only | not run |" + "  |" * len(shown)
    assert "final-eval" not in table
    assert "*(n=k)*: fewer than 3 seeds" in table
    assert "k1 / gspo_large_group" in table  # the note names each pairing
    assert row(table, "ibpo_plain").split(" | ")[-3] == "-"  # no gspo_large_group run: no ratio
    assert table.endswith("![Ablations (IBPO Table 3): the counterfactual partner and joint training](ablations.png)")
    assert "| comparison |" not in table  # one comparison: no column for it


def test_a_table_without_runs_is_one_line_with_the_command_to_run():
    table = table_markdown(SPECS["lambda"], [run("ibpo_plain", 0)])
    assert table.splitlines()[-1] == (
        "*Not run yet:* `python scripts/compare.py --arms gspo_large_group lambda_0 lambda_0.2 lambda_0.4 lambda_0.6 "
        "lambda_0.8 lambda_1.0 --budget-flops ... --out results/compare_lambda`"
    )


def test_an_arm_of_two_comparisons_gets_a_row_per_comparison_never_pooled():
    summaries = [run("ibpo_plain", 0, "results/a", final_val=0.2), run("ibpo_plain", 0, "results/b", final_val=0.8),
                 run("gspo_large_group", 0, "results/a", grad_var_trace=4.0)]
    rows = table_rows(SPECS["baselines"], summaries)
    plain = [r for r in rows if r["label"] == "ibpo_plain"]
    assert [(r["comparison"], r["cells"][0]) for r in plain] == [("results/a", "0.200"), ("results/b", "0.800")]
    diff_col = [c.title for c in SPECS["baselines"].columns].index("val acc - ref, paired")
    assert [r["cells"][diff_col] for r in plain] == ["-", "-"]  # one seed: no paired interval
    # the ratio pairs within a comparison only: results/b has no gspo_large_group
    ratio_col = [c.title for c in SPECS["baselines"].columns].index("grad var / baseline")
    assert [r["cells"][ratio_col] for r in plain] == ["0.25", "-"]
    assert next(r for r in rows if r["label"] == "gspo_large_group")["cells"][ratio_col] == "baseline"
    table = table_markdown(SPECS["baselines"], summaries)
    assert "| arm | comparison | seeds |" in table and "| ibpo_plain *(n=1)* | results/b | 1 | 0.800 |" in table


def test_the_final_eval_column_appears_when_a_run_has_one():
    summaries = [run("gspo_large_group", s, final_eval=0.3 + 0.1 * s) for s in range(3)] + [run("ibpo_plain", 0)]
    table = table_markdown(SPECS["baselines"], summaries)
    header = next(line for line in table.splitlines() if line.startswith("| arm |"))
    assert header.startswith("| arm | seeds | val acc, end | val acc - ref, paired | val gain vs step 0 | final-eval, end "
                             "| reward, last 3 |")  # no difference for final-eval: no arm has pairs
    assert row(table, "gspo_large_group").split(" | ")[5] == "0.400 [0.152, 0.648]"  # 0.4 -+ 4.3027 * 0.1 / sqrt(3)
    assert row(table, "ibpo_plain *(n=1)*").split(" | ")[5] == "-"  # this run was not evaluated
    assert len(row(table, "ibpo_ratio").split("|")) == len(header.split("|"))  # not-run rows fill it too


def test_ciw_arms_pair_with_their_optimizer_without_ciw():
    assert GRAD_VAR_BASELINES["gspo_ciw"] == "gspo" and GRAD_VAR_BASELINES["dapo_ciw"] == "dapo"
    assert GRAD_VAR_BASELINES["k1"] == GRAD_VAR_BASELINES["lambda_0.2"] == "gspo_large_group"
    summaries = [run("gspo", 0, grad_var_trace=2.0), run("gspo_ciw", 0, grad_var_trace=1.0),
                 run("dapo", 0, grad_var_trace=8.0), run("dapo_ciw", 0, grad_var_trace=2.0)]
    rows = {r["label"]: r for r in table_rows(SPECS["ciw"], summaries)}
    ratio_col = [c.title for c in SPECS["ciw"].columns].index("grad var / baseline")
    assert rows["gspo_ciw"]["cells"][ratio_col] == "0.50" and rows["dapo_ciw"]["cells"][ratio_col] == "0.25"
    assert rows["gspo"]["cells"][ratio_col] == "baseline"


def evaluation(benchmark, seed, avg, k=4):
    return {"benchmark": benchmark, "model": "m", "ckpt": None, "k": k, "n_problems": 10, "seed": seed,
            "avg@k": avg, "pass@1": avg, "pass@k": min(1.0, 2 * avg)}


def test_eval_tables_put_methods_in_rows_and_benchmarks_in_columns():
    gspo_aime = combine_runs([evaluation("aime25", s, v) for s, v in enumerate([0.1, 0.2, 0.3])])
    ibpo_aime = combine_runs([evaluation("aime25", s, v) for s, v in enumerate([0.3, 0.5])])
    ibpo_gsm = as_combined(evaluation("gsm8k", 0, 0.7, k=2))  # a single run, combined alone
    text = eval_tables([("GSPO", gspo_aime), ("IBPO", ibpo_aime), ("IBPO", ibpo_gsm)], ["avg@k", "pass@k"])
    assert "### Evaluation: avg@k" in text and "### Evaluation: pass@k" in text
    assert "| method | aime25 avg@4 | gsm8k avg@2 |" in text
    m = gspo_aime["metrics"]["avg@k"]
    assert f"| GSPO | {m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}] | - |" in text
    assert m["mean"] == pytest.approx(0.2)  # (0.1 + 0.2 + 0.3) / 3
    assert "| GSPO | 0.200 [-0.048, 0.448] | - |" in text  # 0.2 -+ 4.3027 * 0.1 / sqrt(3)
    low, high = ibpo_aime["metrics"]["avg@k"]["low"], ibpo_aime["metrics"]["avg@k"]["high"]
    assert f"| IBPO | 0.400 [{low:.3f}, {high:.3f}] *(n=2)* | 0.700 *(n=1)* |" in text
    with pytest.raises(ValueError, match="two evaluation results for 'GSPO' on 'aime25'"):
        eval_tables([("GSPO", gspo_aime), ("GSPO", gspo_aime)])
    with pytest.raises(ValueError, match="not an evaluation result"):
        as_combined({"arm": "x"})


def test_report_holds_every_table_in_order():
    text = report_markdown([run("ibpo_plain", 0)], images={"baselines": "fig/baselines.png"})
    titles = [line for line in text.splitlines() if line.startswith("### ")]
    assert [t.split(" ")[1] for t in titles] == ["GSPO", "Ablations", "Shaping", "Full-rewrite", "Counterfactual"]
    assert "![GSPO with a 4x group against GSPO + IBPO, matched compute](fig/baselines.png)" in text
    assert "Evaluation" not in text


def test_eval_cells_mark_an_old_bootstrap_file():
    old = combine_runs([evaluation("aime25", s, v) for s, v in enumerate([0.1, 0.2, 0.3])], interval="bootstrap")
    assert "*(bootstrap)*" in eval_tables([("GSPO", old)])
    assert "*(bootstrap)*" not in eval_tables([("GSPO", as_combined(evaluation("aime25", 0, 0.1)))])


def test_multiplicity_counts_each_paired_difference_once_and_applies_bonferroni():
    # 3 seeds; k1 beats plain by exactly 0.1 +- tiny noise (excludes 0, even with Bonferroni over 2);
    # shaping_only differs by noise. gspo_large_group is the baseline of ibpo_plain: a third pair.
    noise = [0.0, 0.01, -0.01]
    summaries = [run("gspo_large_group", s, final_val=0.3 + 0.1 * s) for s in range(3)]
    summaries += [run("ibpo_plain", s, final_val=0.4 + d) for s, d in enumerate([0.1, -0.05, 0.02])]
    summaries += [run("k1", s, final_val=0.5 + 0.1 * d) for s, d in enumerate(noise)]
    summaries += [run("shaping_only", s, final_val=0.4 + d) for s, d in enumerate([-0.1, 0.1, 0.0])]
    pairs = {(p["arm"], p["reference"]) for p in paired_comparisons(summaries)}
    # ibpo_plain - gspo_large_group appears in the baselines table only (ablations: it is the reference)
    assert pairs == {("ibpo_plain", "gspo_large_group"), ("k1", "ibpo_plain"), ("shaping_only", "ibpo_plain")}
    note = multiplicity_note(summaries)
    assert "3 paired differences" in note and "0.15 of 3" in note
    # Bonferroni over 3: t_{2, 1 - 0.05/6} = 7.65 against 4.30
    assert "from 4.30 to 7.6" in note and "1.8x as wide" in note
    assert multiplicity_note(summaries[:6]) == ""  # a single comparison: nothing to say
    assert math.isclose(T2, 4.302652729749462)
