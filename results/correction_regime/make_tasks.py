"""The candidate tasks of results/correction_regime/README.md as JSONL (question, answer): the first
problems of each arithmetic stream's held-out seed, as scripts/compare.py --final-eval writes them."""
import json
import sys

from ibpo_lit.data.arithmetic import ArithmeticConfig, arithmetic_problem, held_out

TASKS = {
    "arith2_add_mul": ArithmeticConfig(min_digits=1, max_digits=2, ops=("+", "*")),  # the configs' task
    "arith3_mixed": ArithmeticConfig(min_digits=1, max_digits=2, ops=("+", "-", "*"), operands=3),
    "arith4_mixed": ArithmeticConfig(min_digits=1, max_digits=2, ops=("+", "-", "*"), operands=4),
}

if __name__ == "__main__":
    out, n = sys.argv[1], int(sys.argv[2])
    for name, cfg in TASKS.items():
        stream = held_out(cfg)
        with open(f"{out}/{name}.jsonl", "w") as f:
            for i in range(n):
                text, gold = arithmetic_problem(i, stream)
                f.write(json.dumps({"question": text, "answer": gold}) + "\n")
