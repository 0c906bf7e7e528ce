"""Run by test_moe_weights.py in its own process (one vLLM engine per process): a tiny
Qwen3-MoE in vLLM's CPU build, started with dummy weights, then synced from the trained model.

    python tests/rollout/moe_engine_probe.py OUT_JSON MODEL_DIR
"""
import json
import os
import sys

import torch


def tiny_qwen3_moe(seed: int = 0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32, intermediate_size=128, moe_intermediate_size=32,
                            num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
                            max_position_embeddings=512, eos_token_id=2, pad_token_id=2, bos_token_id=None)
    config.architectures = ["Qwen3MoeForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3MoeForCausalLM(config).eval()


def main(out_path: str, folder: str) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from ibpo_lit.rollout import SamplingConfig
    from ibpo_lit.rollout.vllm_engine import VLLMConfig, VLLMRolloutEngine
    from ibpo_lit.rollout.weights import SyncManifest, iter_full_weights
    from ibpo_lit.training.logprobs import response_logprobs

    model = tiny_qwen3_moe()
    model.config.save_pretrained(folder)  # no weights on disk: the engine starts from dummy ones
    engine = VLLMRolloutEngine(folder, [2], 2, SamplingConfig(max_new_tokens=12),
                               VLLMConfig(dtype="float32", cpu_kvcache_space_gib=1, max_model_len=256))

    def mismatch():
        batch = engine.generate([[5, 6, 7], [8, 9]], n=2, seeds=range(4))
        with torch.no_grad():
            logp = response_logprobs(model, batch, 1.0)
        mask = batch.response_mask
        return float(((logp - batch.rollout_logp).abs() * mask).sum() / mask.sum())

    before = mismatch()
    manifest = SyncManifest()
    engine.sync_weights(iter_full_weights(model, manifest))
    after = mismatch()
    with open(out_path, "w") as f:
        json.dump({"before_sync": before, "after_sync": after, "sent": manifest.sent, "missing": manifest.missing()}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
