"""The trainer's forward + backward of one micro-batch, three ways (``rollout.packing``):

* ``per_row``: the plain padded forward (``single_pass``, what FSDP2 runs today);
* ``shared``: the default path (a prompt shared by a group forwarded once, responses in
  length buckets: ``training/logprobs.py``);
* ``packed``: the rows end to end in one sequence (``rollout.packing: on``,
  ``training/packing.py``), under the ``--attn`` implementations asked for.

    python scripts/bench_packing.py --device cpu --shape tiny-wide --dtype fp32            # CPU
    python scripts/bench_packing.py --device cuda --shape qwen3-0.6b --dtype bf16 \\
        --attn sdpa flex_attention                                                          # GPU
    python scripts/bench_packing.py --device cpu --model smollm2-135m-instruct --threads 2  # a real model

One micro-batch of ``--prompts`` prompts x ``--group-size`` responses, prompt and response
lengths drawn uniformly (seeded) from ``--prompt-tokens`` / ``--response-tokens``; a loss
``sum(logp * mask)`` backwarded. The modes run round-robin (one of each per repeat, after
``--warmup`` rounds), so a machine's load drifts over all of them alike; the median seconds of
each, its tokens per second (real prompt + response tokens), its peak memory on a GPU, and each
mode's largest |log-prob - per_row's| over the response tokens (float rounding only). Models are
Qwen3s with the shapes of scripts/gpu_check_cases.py and random weights (no download), or
``--model``: any name or path ``model.model`` takes (``ibpo_lit.models.loading.load_policy``). Writes a
JSON (``--out``) and prints it. Not covered: flash-attention (not installed on the machines
this was written for; ``--attn flash_attention_2`` runs it where it is).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import torch  # noqa: E402

from gpu_check_cases import SHAPES, build_model  # noqa: E402
from ibpo_lit.rollout.batch import RolloutBatch  # noqa: E402
from ibpo_lit.training.logprobs import response_logprobs  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shape", default="tiny-wide", choices=sorted(SHAPES))
    p.add_argument("--model", default=None, help="a model.model name or path instead of --shape")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, nargs=2, default=(64, 256), metavar=("MIN", "MAX"))
    p.add_argument("--response-tokens", type=int, nargs=2, default=(32, 512), metavar=("MIN", "MAX"))
    p.add_argument("--attn", nargs="+", default=["sdpa"], help="attention implementations of the packed mode")
    p.add_argument("--modes", nargs="+", default=["per_row", "shared", "packed"])
    p.add_argument("--chunk-tokens", type=int, default=None, help="model.logprob_chunk_tokens")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def make_batch(args, vocab: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(args.seed)

    def draw(low, high):
        return int(torch.randint(low, high + 1, (1,), generator=g))

    prompts = [torch.randint(4, vocab, (draw(*args.prompt_tokens),), generator=g).tolist() for _ in range(args.prompts)]
    rows = args.prompts * args.group_size
    responses = [torch.randint(4, vocab, (draw(*args.response_tokens),), generator=g).tolist() for _ in range(rows)]
    return RolloutBatch.from_lists([prompts[i // args.group_size] for i in range(rows)], responses,
                                   [[0.0] * len(r) for r in responses], [True] * rows, list(range(rows)),
                                   [i // args.group_size for i in range(rows)], pad_token_id=0)


def arms(args) -> list[tuple[str, str, dict]]:
    """(name, attention implementation, response_logprobs keywords) of each arm."""
    out = []
    for mode in args.modes:
        if mode == "packed":
            out += [(f"packed[{attn}]", attn, dict(packing="on")) for attn in args.attn]
        else:
            out.append((mode, "sdpa", dict(single_pass=mode == "per_row")))
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.model:
        from ibpo_lit.models.loading import load_policy

        model = load_policy(args.model, {"fp32": "float32", "bf16": "bfloat16"}[args.dtype])[0]
    else:
        model = build_model(args.shape, seed=0)
    model = model.to(device=device, dtype=DTYPES[args.dtype]).train()
    batch = make_batch(args, model.config.vocab_size).to(device)
    mask = batch.response_mask
    real = int(batch.prompt_mask.sum() + mask.sum())
    cuda = device.type == "cuda"

    def run(attn: str, kwargs: dict):
        if model.config._attn_implementation != attn:
            model.set_attn_implementation(attn)
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        logp = response_logprobs(model, batch, 1.0, chunk_tokens=args.chunk_tokens, **kwargs)
        (logp * mask).sum().backward()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None
        return seconds, peak, logp.detach().float()

    chosen = arms(args)
    times = {name: [] for name, _, _ in chosen}
    peaks, diffs, reference = {}, {}, None
    errors = {}
    for round_ in range(args.warmup + args.repeats):
        for name, attn, kwargs in list(chosen):
            try:
                seconds, peak, logp = run(attn, kwargs)
            except Exception as error:  # an attention implementation this machine lacks: reported, not fatal
                errors[name] = f"{type(error).__name__}: {error}"[:500]
                chosen.remove((name, attn, kwargs))
                continue
            print(f"round {round_} {name}: {seconds:.3f} s", file=sys.stderr, flush=True)
            if reference is None:
                reference = logp
            diffs[name] = float((logp - reference)[mask].abs().max())
            peaks[name] = peak
            if round_ >= args.warmup:
                times[name].append(seconds)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "args": vars(args), "rows": len(batch), "real_tokens": real,
        "padded_tokens": len(batch) * (batch.prompt_ids.shape[1] + batch.response_ids.shape[1]),
        "reference": chosen[0][0], "errors": errors,
        "arms": {name: {"median_s": statistics.median(times[name]), "all_s": times[name],
                        "tokens_per_s": real / statistics.median(times[name]), "peak_gib": peaks[name],
                        "max_abs_logp_diff": diffs[name]} for name, _, _ in chosen},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
