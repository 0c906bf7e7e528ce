"""What one GPU does with ibpo-lit's training step: seconds per step, tokens/s, MFU, peak memory.

    python scripts/gpu_check.py --out gpu_check.json                     # on a GPU machine
    python scripts/gpu_check.py --device cpu --shapes tiny --steps 2     # the same code, seconds, CPU

For sessions lent a GPU machine (no vLLM there, nothing to download): each model is a Qwen3
built in code with the real shapes of Qwen3-0.6B and Qwen3-1.7B (vocabulary 151,936, tied
embeddings) and random weights, trained by the real ``IBPOModule`` under
``ibpo_lit.scale.FSDP2Strategy`` on one device with ``precision: bf16-mixed`` (FSDP2's mixed
precision: bf16 compute, fp32 master weights and gradient reduction), gradient checkpointing,
the HF rollout engine, GSPO + IBPO with ``CorrectionRollouts``: the whole step, rollouts and
corrections included. Random weights answer nothing right, so rewards come from a hash of each
response (half the rows right): the update then trains every row, as a real run's would.

Reported per model, over the steps after ``--warmup``: seconds per step and per update,
generated and trained tokens per second, the peak memory allocated against the plan's
(`python -m ibpo_lit plan`'s arithmetic for the same run, tensors only), MFU of the whole step and of the update alone
(parameter FLOPs, ``ibpo_lit.algorithms.diagnostics.estimate_flops``: 2N per prefilled or
generated token, 6N per trained token, attention not counted) against the device's dense bf16
peak (H100/H200 SXM: 989 TFLOP/s; ``--peak-tflops`` for others), and the peak memory allocated.
HF decoding is one token per forward, so the step's MFU is low by design; the update's is the
trainer's.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import zlib
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Shapes of the Hugging Face checkpoints (their config.json), no weights.
SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, vocab_size=1000, tie_word_embeddings=True),
}
BF16_PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1}


def build_model(shape: str, seed: int = 0):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ibpo_lit.models.tiny import IM_END, SPECIAL_TOKENS

    eos = SPECIAL_TOKENS.index(IM_END)
    config = Qwen3Config(**SHAPES[shape], max_position_embeddings=40960, rope_theta=1_000_000.0,
                         eos_token_id=eos, pad_token_id=eos, bos_token_id=None, attention_dropout=0.0)
    config.architectures = ["Qwen3ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(config)


def peak_tflops(device_name: str, override: float | None) -> float | None:
    if override is not None:
        return override
    return next((v for k, v in BF16_PEAK_TFLOPS.items() if k in device_name), None)


def run_shape(shape: str, args) -> dict:
    import lightning as L
    import torch

    from callbacks import CorrectionRollouts
    from ibpo_lit.algorithms.diagnostics import estimate_flops
    from ibpo_lit.config import OptimConfig, RolloutConfig
    from ibpo_lit.data.datamodule import PromptDataModule
    from ibpo_lit.models.loading import BUILTIN_MODELS
    from ibpo_lit.module import IBPOModule
    from ibpo_lit.rollout.engine import SamplingConfig
    from ibpo_lit.scale import FSDP2Strategy

    name = f"gpu-check-{shape}"
    BUILTIN_MODELS[name] = partial(build_model, shape)  # built in code on every rank (no files)

    class HashRewards(L.Callback):
        def on_rollouts_scored(self, trainer, pl_module, step):
            step.rewards = torch.tensor([float(zlib.crc32(str(r).encode()) % 2) for r in step.rollouts.response_lists()])

    class Record(L.Callback):
        def __init__(self):
            self.steps: list[dict] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            stats = dataclasses.asdict(pl_module.step_stats)
            stats["update_s"] = float(trainer.callback_metrics.get("timing/update_s", math.nan))
            self.steps.append(stats)

    on_gpu = args.device == "cuda"
    module = IBPOModule(
        model=name,
        dtype="float32",
        rollout=RolloutConfig(group_size=args.group_size, micro_batch_size=args.micro_batch_size,
                              sampling=SamplingConfig(max_new_tokens=args.max_new_tokens)),
        optim=OptimConfig(lr=1e-6, warmup_ratio=0.0),
        gradient_checkpointing=True,
    )
    data = PromptDataModule(tokenizer=name, prompts_per_step=args.prompts, max_prompt_tokens=256)
    record = Record()
    trainer = L.Trainer(
        accelerator="gpu" if on_gpu else "cpu", devices=1, strategy=FSDP2Strategy(),
        precision="bf16-mixed", max_steps=args.warmup + args.steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[HashRewards(), CorrectionRollouts(), record],
    )
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer.fit(module, data)
    total_s = time.perf_counter() - start
    n_params = sum(p.numel() for p in module.policy.parameters())
    timed = record.steps[args.warmup:]
    step_s = sum(s["step_seconds"] for s in timed) / len(timed)
    update_s = sum(s["update_s"] for s in timed) / len(timed)
    flops = [estimate_flops(n_params, s["prompt_tokens"] + s["correction_prompt_tokens"],
                            s["generated_tokens"] + s["correction_tokens"], s["trained_tokens"],
                            s["no_grad_tokens"]) for s in timed]
    step_flops = sum(f["total"] for f in flops) / len(flops)
    train_flops = sum(f["training"] for f in flops) / len(flops)
    generated = sum(s["generated_tokens"] + s["correction_tokens"] for s in timed) / len(timed)
    trained = sum(s["trained_tokens"] for s in timed) / len(timed)
    device_name = torch.cuda.get_device_name() if on_gpu else "cpu"
    peak = peak_tflops(device_name, args.peak_tflops)
    planned = planned_peak_gib(module, data, trainer)
    return {
        "shape": shape,
        "device": device_name,
        "params": n_params,
        "steps_timed": len(timed),
        "step_s": step_s,
        "update_s": update_s,
        "generated_tokens_per_step": generated,
        "trained_tokens_per_step": trained,
        "generated_tokens_per_s": generated / step_s,
        "trained_tokens_per_s": trained / update_s if update_s > 0 else math.nan,
        "step_tflops": step_flops / step_s / 1e12,
        "update_tflops": train_flops / update_s / 1e12 if update_s > 0 else math.nan,
        "peak_bf16_tflops": peak,
        "mfu_step": step_flops / step_s / (peak * 1e12) if peak else None,
        "mfu_update": train_flops / update_s / (peak * 1e12) if peak and update_s > 0 else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
        "plan_peak_gib": planned,
        "fit_s": total_s,
    }


def planned_peak_gib(module, data, trainer) -> dict[str, float]:
    """What `python -m ibpo_lit plan` predicts for this run, per phase, in GiB of tensors (no
    CUDA context or allocator overhead: ``torch.cuda.max_memory_allocated`` counts neither)."""
    from ibpo_lit.plan.memory import GIB
    from ibpo_lit.plan.plan import PlanSettings, build_plan
    from ibpo_lit.plan.run import RunShape
    from ibpo_lit.plan.shapes import ModelShape

    plan = build_plan(ModelShape.from_config(module.policy.config), RunShape.from_fit(module, data, trainer),
                      PlanSettings(overhead_gib=0.0, gpu_memory_gib=80.0))
    return {phase.name: phase.total / GIB for phase in plan.phases}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "qwen3-1.7b"], choices=sorted(SHAPES))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after --warmup)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of an unlisted device")
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device: run on a GPU machine, or pass --device cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results = [run_shape(shape, args) for shape in args.shapes]
    for r in results:
        mfu = f"{r['mfu_update']:.1%}" if r["mfu_update"] is not None else "n/a"
        memory = f"{r['peak_memory_gib']:.1f} GiB" if r["peak_memory_gib"] is not None else "n/a"
        memory += f" (plan: {max(r['plan_peak_gib'].values()):.1f} GiB)"
        print(f"{r['shape']}: {r['step_s']:.2f} s/step ({r['update_s']:.2f} s update), "
              f"{r['generated_tokens_per_s']:.0f} generated tok/s, {r['trained_tokens_per_s']:.0f} trained tok/s, "
              f"update MFU {mfu}, peak memory {memory}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
