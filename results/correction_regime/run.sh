#!/usr/bin/env bash
# Each candidate task: SmolLM2-135M-Instruct (untrained), 40 held-out problems x k = 8 samples,
# the rollouts' decoding (temperature 0.7, 64 new tokens for 2 operands, 128 otherwise), and the
# ORACLE correction baseline (each sample corrected against a correct sample of its problem where
# one exists): ttc_oracle_fixed is the share of wrong samples a correction makes right, the
# quantity IBPO's train/correction_success measures at these weights.
set -euo pipefail
cd "$(dirname "$0")/../.."
# gsm8k reads ../shared/data/gsm8k_test.jsonl (the public test set beside the checkout; 256 tokens).
for task in "$@"; do
  tokens=128; [ "$task" = arith2_add_mul ] && tokens=64
  data=(--path "results/correction_regime/$task.jsonl" --answer_format plain)
  [ "$task" = gsm8k ] && tokens=256 && data=(--path ../shared/data/gsm8k_test.jsonl)
  python -m ibpo_lit evaluate --model_name_or_path smollm2-135m-instruct --benchmark "$task" \
    "${data[@]}" --k 8 --limit 40 \
    --temperature 0.7 --top_p 1.0 --top_k 0 --max_new_tokens "$tokens" \
    --instruction "Give the final answer after ####." --backend vllm --vllm.dtype float32 \
    --baselines test_time_correction_oracle --output "results/correction_regime/$task.json"
done
