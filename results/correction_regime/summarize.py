"""The correction rates of each measured task, as IBPO meets them (issue 34, item 3).

``ttc_oracle_fixed`` (the evaluate command's) counts every wrong sample, also those of problems
with no correct sample, whose reference is then another wrong one. IBPO pairs a wrong rollout
only with a correct one of its group, so the rate that decides whether its shaping acts is the
share fixed among wrong samples of problems with at least one correct sample. Both, with 95%
Clopper-Pearson intervals over samples (samples of one problem are not independent: read the
intervals as a lower bound on the uncertainty), and how many problems and samples each rests on.

    python results/correction_regime/summarize.py   # rewrites summary.md beside it
"""
from __future__ import annotations

import json
from pathlib import Path

from scipy.stats import beta

HERE = Path(__file__).resolve().parent
TASKS = ["arith2_add_mul", "arith3_mixed", "arith4_mixed", "gsm8k"]


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    lo = 0.0 if k == 0 else beta.ppf(0.025, k, n - k + 1)
    hi = 1.0 if k == n else beta.ppf(0.975, k + 1, n - k)
    return float(lo), float(hi)


def rates(result: dict) -> dict:
    all_fixed = all_wrong = paired_fixed = paired_wrong = paired_problems = 0
    for p in result["problems"]:
        wrong = [i for i, s in enumerate(p["scores"]) if s != 1.0]
        fixed = sum(1 for i in wrong if p["ttc_oracle_scores"][i] == 1.0)
        all_fixed, all_wrong = all_fixed + fixed, all_wrong + len(wrong)
        if p["n_correct"] > 0 and wrong:
            paired_fixed, paired_wrong, paired_problems = paired_fixed + fixed, paired_wrong + len(wrong), paired_problems + 1
    return {"all": (all_fixed, all_wrong), "paired": (paired_fixed, paired_wrong), "paired_problems": paired_problems}


def main() -> None:
    rows = ["| task | problems x k | avg@k | fixed, all wrong samples | fixed, wrong samples with a correct partner (IBPO's case) | problems with a partner |",
            "| --- | --- | --- | --- | --- | --- |"]
    for task in TASKS:
        path = HERE / f"{task}.json"
        if not path.exists():
            continue
        result = json.loads(path.read_text())
        r = rates(result)
        cells = []
        for key in ("all", "paired"):
            k, n = r[key]
            lo, hi = clopper_pearson(k, n)
            cells.append(f"{k}/{n} = {k / n:.3f} [{lo:.3f}, {hi:.3f}]" if n else "none")
        rows.append(f"| {task} | {result['n_problems']} x {result['k']} | {result['avg@k']:.3f} | {cells[0]} | {cells[1]} | "
                    f"{r['paired_problems']} |")
    (HERE / "summary.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
