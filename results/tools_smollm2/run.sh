#!/usr/bin/env bash
# SmolLM2-135M-Instruct (untrained) on three-number arithmetic (results/correction_regime's held-out
# problems), asked to compute in a Python cell: the same 20 problems x 4 samples sampled with
# tool-integrated rollouts (--tools.*: cells run in the sandbox, output appended) and without
# (the cells stay text). What it measures: that the plumbing runs on a real model, how often a
# 135M model writes a cell that runs, and whether running it changes accuracy at these weights.
set -euo pipefail
cd "$(dirname "$0")/../.."
common=(--model_name_or_path smollm2-135m-instruct --benchmark arith3_mixed
  --path results/correction_regime/arith3_mixed.jsonl --answer_format plain --k 4 --limit 20
  --temperature 0.7 --top_p 1.0 --top_k 0 --max_new_tokens 192 --keep_completions true
  --instruction "Write a \`\`\`python code block that prints the result, then give the final answer after ####."
  --backend vllm --vllm.dtype float32)
python -m ibpo_lit evaluate "${common[@]}" --tools.max_tool_calls 2 --tools.max_output_chars 256 \
  --output results/tools_smollm2/with_tools.json
python -m ibpo_lit evaluate "${common[@]}" --output results/tools_smollm2/without_tools.json
