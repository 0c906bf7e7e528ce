"""Checks of the FSDP2 pieces on 2 real processes, run by tests/scale/test_fsdp2.py as
``python -m torch.distributed.run --nproc_per_node 2 fsdp2_checks.py OUT_DIR``. Each rank
writes ``OUT_DIR/rank<r>.json``: check name -> result, compared by the test."""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ibpo_lit.models.loading import build_builtin_model, load_sharded_policy
from ibpo_lit.rollout import HFRolloutEngine, SamplingConfig
from ibpo_lit.rollout.weights import SyncManifest, iter_full_weights
from ibpo_lit.scale.fsdp2 import FSDP2Plan, gathered_weights, is_sharded
from ibpo_lit.training.logprobs import response_logprobs


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = {}

    # 1. loading: the sharded model holds the reference's weights; ties and fp32 rotary survive
    for dtype in ("float32", "bfloat16"):
        reference = build_builtin_model("tiny-qwen3", dtype, seed=3)
        model, _ = load_sharded_policy("tiny-qwen3", FSDP2Plan(mesh=mesh), dtype=dtype, seed=3)
        ref_sd = reference.state_dict()
        out[f"load_{dtype}_max_diff"] = max(float((full(p).float() - ref_sd[n].float()).abs().max())
                                           for n, p in model.state_dict().items())
        out[f"load_{dtype}_tied"] = model.lm_head.weight is model.model.embed_tokens.weight
        inv = model.model.rotary_emb.inv_freq
        out[f"load_{dtype}_inv_freq"] = [str(inv.dtype), float((inv - reference.model.rotary_emb.inv_freq.float()).abs().max())]
        local = [p._local_tensor.numel() for p in model.parameters() if hasattr(p, "_local_tensor")]
        out[f"load_{dtype}_local_numel"] = sum(local)
        out[f"load_{dtype}_full_numel"] = sum(p.numel() for p in reference.parameters())
        # what ComputeBudgetStopper counts as N: DTensor.numel() is the global size
        out[f"load_{dtype}_numel_seen"] = sum(p.numel() for p in model.parameters())

    # model.attn_implementation reaches the meta build that FSDP2 shards
    eager, _ = load_sharded_policy("tiny-qwen3", FSDP2Plan(mesh=mesh), seed=3, attn_implementation="eager")
    out["load_eager_attention"] = eager.config._attn_implementation
    del eager

    model, tokenizer = load_sharded_policy("tiny-qwen3", FSDP2Plan(mesh=mesh), seed=3)
    reference = build_builtin_model("tiny-qwen3", seed=3)

    # 2. weight iteration over shards: every tensor whole, under its checkpoint name
    manifest = SyncManifest()
    sent = {n: t.clone() for n, t in iter_full_weights(model, manifest)}
    ref = dict(iter_full_weights(reference))
    out["weights_names_equal"] = sorted(sent) == sorted(ref)
    out["weights_max_diff"] = max(float((sent[n] - ref[n]).abs().max()) for n in ref)
    out["weights_missing"] = manifest.missing()
    # a bf16 engine: each shard cast before the gather moves half the bytes, with the same values
    fp32, bf16 = SyncManifest(), SyncManifest()
    as_fp32 = {n: t.clone() for n, t in iter_full_weights(model, fp32)}
    as_bf16 = {n: t.clone() for n, t in iter_full_weights(model, bf16, dtype=torch.bfloat16)}
    out["sync_gathered_bytes"] = [fp32.gathered_bytes, bf16.gathered_bytes]
    out["sync_bf16_dtypes"] = sorted({str(t.dtype) for t in as_bf16.values()})
    out["sync_bf16_is_cast_after_gather"] = all(torch.equal(as_bf16[n], as_fp32[n].to(torch.bfloat16)) for n in as_fp32)

    # 3. generation with gathered weights: ranks decode different numbers of steps
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, SamplingConfig(max_new_tokens=6 + 10 * rank))
    prompts = [[5, 6, 7]] if rank == 0 else [[8, 9], [10, 11, 12, 13]]
    batch = engine.generate(prompts, n=2, seeds=list(range(100 * rank, 100 * rank + 2 * len(prompts))))
    ref_batch = HFRolloutEngine(reference, [tokenizer.eos_token_id], tokenizer.pad_token_id,
                                SamplingConfig(max_new_tokens=6 + 10 * rank)).generate(
        prompts, n=2, seeds=list(range(100 * rank, 100 * rank + 2 * len(prompts))))
    out["generate_same_tokens"] = batch.response_lists() == ref_batch.response_lists()
    out["sharded_after_generate"] = all(hasattr(p, "_local_tensor") for p in model.parameters())
    empty = engine.generate([], n=2, seeds=[])  # a rank with nothing to generate still takes part
    out["empty_generate_rows"] = len(empty)
    with gathered_weights(model):
        out["gathered_is_plain"] = not any(hasattr(p, "_local_tensor") for p in model.parameters())

    # 4. log-probs and gradients of the sharded model (chunked head, one pass) match the reference
    model.zero_grad()
    reference.zero_grad()
    logp = response_logprobs(model, batch, 0.9, single_pass=True, chunk_tokens=5)
    expected = response_logprobs(reference, batch, 0.9)
    mask = batch.response_mask
    out["logp_max_diff"] = float(((logp - expected) * mask).abs().max())
    (logp * mask).sum().backward()
    (expected * mask).sum().backward()
    # FSDP2 averages gradients over ranks: the reference's mean over the ranks' batches
    ref_grads = {n: p.grad.clone() for n, p in reference.named_parameters() if p.grad is not None}
    for g in ref_grads.values():
        dist.all_reduce(g)
        g /= dist.get_world_size()
    grads = {n: full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    out["grad_max_diff"] = max(float((grads[n] - ref_grads[n]).abs().max()) for n in ref_grads)
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], 1e9)
    out["grad_norm"] = float(full(norm))
    out["grad_norm_reference"] = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in ref_grads.values()])))
    out["is_sharded"] = is_sharded(model)

    # 5. gradient checkpointing on the sharded model (recomputation re-gathers each layer)
    model.zero_grad()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    logp = response_logprobs(model, batch, 0.9, single_pass=True, chunk_tokens=5)
    (logp * mask).sum().backward()
    ckpt_grads = {n: full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    out["checkpointed_grad_max_diff"] = max(float((ckpt_grads[n] - ref_grads[n]).abs().max()) for n in ref_grads)

    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    from rank_exit import end_processes  # tests/scale, on the workers' path

    end_processes()


if __name__ == "__main__":
    main(sys.argv[1])
