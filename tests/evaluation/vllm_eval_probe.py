"""Run in its own process by test_vllm_backend.py (vLLM's state is per process): the evaluation's
vLLM engine (`build_engine(..., "vllm")`, training's factory) over a tiny model whose weights exist
nowhere on disk must decode greedily exactly as the HF engine does, with the trainer's log-probs;
the folder it was started from goes with it."""
import json
import os
import sys

import torch

from ibpo_lit.evaluation.sampling import close_engine
from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer
from ibpo_lit.rollout import SamplingConfig
from ibpo_lit.rollout.factory import build_engine
from ibpo_lit.rollout.vllm_engine import VLLMConfig
from ibpo_lit.training.logprobs import response_logprobs

model, tokenizer = build_tiny_model(seed=0), build_tiny_tokenizer()
with torch.no_grad():  # weights no config or seed reproduces: only the sync can bring them
    generator = torch.Generator().manual_seed(123)
    for p in model.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=generator))
model.eval()
prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)["input_ids"]
           for t in ("hi", "what is 12 + 30?", "three")]
greedy = SamplingConfig(top_k=1, max_new_tokens=12)
vllm = build_engine(model, tokenizer, greedy, "vllm",
                    vllm=VLLMConfig(dtype="float32", cpu_kvcache_space_gib=1, max_model_len=256))
folder, context_limit = vllm.model_folder.name, vllm.context_limit
from_vllm = vllm.generate(prompts, n=2, seeds=range(6))
# Sampled with no filter, vLLM's log-probs are the full distribution's, as the trainer computes them
# (under top-k they are renormalised over the kept tokens: greedy gives 0).
sampled = vllm.generate(prompts, n=2, seeds=range(6), sampling=SamplingConfig(top_k=0, max_new_tokens=12))
folder_existed = os.path.isdir(folder)
close_engine(vllm)
from_hf = build_engine(model, tokenizer, greedy, "hf").generate(prompts, n=2, seeds=range(6))
with torch.no_grad():
    trainer = response_logprobs(model, sampled, temperature=1.0)
mask = sampled.response_mask
json.dump({
    "same_tokens": from_vllm.response_lists() == from_hf.response_lists(),
    "tokens": from_vllm.response_lists(),
    "logp_max_diff": float(((trainer - sampled.rollout_logp).abs() * mask).max()),
    "folder_lived_with_engine": folder_existed and not os.path.exists(folder),
    "context_limit": context_limit,
}, open(sys.argv[1], "w"))
