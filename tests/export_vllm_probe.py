"""Run in its own process by test_export.py (vLLM's state is per process): vLLM loads an exported
folder as it loads any model (``load_format: auto``, no weight sync), and the log-probs it gives
its own samples are the trained policy's, computed by the trainer's code from the checkpoint.

argv: CKPT_PATH EXPORTED_FOLDER OUT_JSON START_SEED (the built-in model's seed the run started from)
"""
import json
import sys

import torch

from ibpo_lit.models.export import trained_policy
from ibpo_lit.models.loading import build_builtin_model
from ibpo_lit.rollout import SamplingConfig
from ibpo_lit.rollout.vllm_engine import VLLMConfig, VLLMRolloutEngine
from ibpo_lit.training.logprobs import response_logprobs

ckpt_path, folder, out, seed = sys.argv[1:5]
policy, tokenizer = trained_policy(ckpt_path)
prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)["input_ids"]
           for t in ("hi", "what is 12 + 30?", "three")]
# No top-k/top-p: vLLM's log-probs are then the full distribution's, as the trainer computes them.
engine = VLLMRolloutEngine(folder, [tokenizer.eos_token_id], tokenizer.pad_token_id,
                           SamplingConfig(top_k=0, max_new_tokens=12),
                           VLLMConfig(dtype="float32", cpu_kvcache_space_gib=1, max_model_len=256, load_format="auto"))
batch = engine.generate(prompts, n=2, seeds=range(6))
engine.close()
mask = batch.response_mask
with torch.no_grad():
    trained = response_logprobs(policy, batch, temperature=1.0)
    start = response_logprobs(build_builtin_model("tiny-llama", "float32", int(seed)), batch, temperature=1.0)
json.dump({
    "tokens": int(mask.sum()),
    "logp_max_diff": float(((trained - batch.rollout_logp).abs() * mask).max()),
    "start_max_diff": float(((start - batch.rollout_logp).abs() * mask).max()),
}, open(out, "w"))
