"""Run by test_vllm_compiled.py in its own process (one vLLM engine per process): a compiled
(``enforce_eager: false``) engine over the tiny model, weight sync, and log-prob agreement.

    python tests/rollout/compiled_engine_probe.py OUT_JSON MODEL_DIR
"""
import copy
import json
import sys
import time

import torch


def main(out_path: str, folder: str) -> None:
    from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer
    from ibpo_lit.rollout import SamplingConfig
    from ibpo_lit.rollout.vllm_engine import VLLMConfig, VLLMRolloutEngine
    from ibpo_lit.rollout.weights import iter_full_weights
    from ibpo_lit.training.logprobs import response_logprobs

    model, tokenizer = build_tiny_model(seed=0), build_tiny_tokenizer()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    start = time.perf_counter()
    # load_format auto: this probe samples before its first sync (the trainer never does).
    config = VLLMConfig(dtype="float32", cpu_kvcache_space_gib=1, max_model_len=256, enforce_eager=False,
                        load_format="auto")
    engine = VLLMRolloutEngine(folder, [2], 2, SamplingConfig(max_new_tokens=16), config)
    start_s = time.perf_counter() - start

    def mismatch(policy, batch):
        policy.eval()
        with torch.no_grad():
            logp = response_logprobs(policy, batch, temperature=1.0)
        mask = batch.response_mask
        return float(((logp - batch.rollout_logp).abs() * mask).sum() / mask.sum())

    chats = [[{"role": "user", "content": t}] for t in ("hi", "what is 12 + 30?")]
    prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True)["input_ids"] for c in chats]
    before = engine.generate(prompts, n=2, seeds=range(4))
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.2)
    engine.sync_weights(iter_full_weights(changed))
    after = engine.generate(prompts, n=2, seeds=range(4))
    engine.sync_weights(iter_full_weights(model))
    restored = engine.generate(prompts, n=2, seeds=range(4))
    result = {
        "start_s": start_s,
        "mismatch_before": mismatch(model, before),
        "mismatch_changed": mismatch(changed, after),
        "changed": after.response_lists() != before.response_lists(),
        "restored": restored.response_lists() == before.response_lists(),
        "compiled": not engine.llm.llm_engine.vllm_config.model_config.enforce_eager,
    }
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
