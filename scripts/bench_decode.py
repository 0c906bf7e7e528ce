"""How fast the HF engine decodes on one GPU, beside transformers' own ``generate``, in one run.

    python scripts/bench_decode.py --budget-s 140                  # on the GPU machine
    python scripts/bench_decode.py --device cpu --shape tiny --batch 4 --prompt-tokens 8 \\
        --max-new-tokens 8 --repeats 1                             # the same code on the CPU

Issue 45 item 3 asks the HF engine for at least the tokens/s of transformers' ``generate`` with a
static cache and ``torch.compile``, on the same batch and lengths. Arms, each on the same model
object and the same prompts (random token ids from ``--seed``, all ``--prompt-tokens`` long, so
no padding), at temperature 1 with no top-k/top-p/min-p:

* ``hf_engine``: ``ibpo_lit.rollout.hf.HFRolloutEngine(...).generate(prompts, 1, seeds)``, one
  seed per row, the log-prob of every sampled token computed on the way (what training uses);
* ``hf_engine_static``: the same engine with ``decode="static"`` (``rollout.hf_decode: static``):
  a ``StaticCache`` made once per call, counter-based per-row uniforms, and its decode step
  (forward, log-prob, sampling) compiled with ``mode="reduce-overhead"`` (CUDA graphs) on a GPU;
  eager on the CPU, the engine's default there (``compiled_step`` in the JSON says which);
* ``transformers_static_compiled``: ``model.generate(..., cache_implementation="static",
  compile_config=CompileConfig())``: transformers' documented automatic compilation of the
  decode step (``_valid_auto_compile_criteria``: a compileable cache on a GPU, or
  ``_compile_all_devices`` set on the config, which this script does on the CPU only);
  ``CompileConfig``'s defaults are ``mode="reduce-overhead"`` (CUDA graphs), ``fullgraph=False``;
* ``transformers_dynamic``: ``model.generate(...)`` with its default dynamic cache, eager.
* ``floor_weight_matmuls`` and ``floor_weight_reads`` (only when named in ``--arms``): not
  decodes but two lower bounds of any decode of this model on this device, by the work no step can
  skip (`floor_arm`): each step's weight matmuls at the batch's shape, alone; each weight matrix
  read once. A decode arm's ``s_per_step`` over a floor's says how far it is from that bound; a
  floor's ``speed_vs_hf_engine`` is the engine's seconds over the floor's. Issue 45 item 4 asks
  whether 3x TRL per step is within reach on a 2-core CPU: these say what the decode cannot go
  below there (docs/benchmarks.md, "How far the decode is from its floors")::

      python scripts/bench_decode.py --device cpu --shape smollm2-135m-like --batch 16 \\
          --prompt-tokens 47 --max-new-tokens 128 --budget-s 900 --out-dir results/bench_decode \\
          --arms hf_engine transformers_dynamic floor_weight_matmuls floor_weight_reads

The transformers arms sample from the global generator (re-seeded before each call) and return
tokens only: no per-row seeds, no log-probs. Every row generates exactly ``--max-new-tokens``
tokens in every arm, so the work is the same: the end-of-sequence id given to each arm is the
vocabulary size, an id no sampler can draw (logits have ``vocab_size`` columns). Not
``min_new_tokens``: its processor would be one more pass over the logits that only some arms
run. Each call's generated tokens are counted from what it returned (not assumed) and recorded,
with a CRC of them (equal CRCs across an arm's calls: the same tokens again).

Per arm: ``--warmup`` untimed calls (the compiled arm's compilation and CUDA-graph recording,
cuDNN's attention plans for each new cache length), then ``--repeats`` timed calls (each ended by
a device synchronisation; prefill included). Recorded: warm-up seconds, the median timed call,
generated tokens/s, its ratio to ``hf_engine``'s (and ``hf_engine_static``'s and ``hf_engine``'s
over the compiled static ``generate``'s: the issue's goal is >= 1), peak GPU memory, and the graphs dynamo compiled
during warm-up and during the timed calls (the latter should be 0), with graph breaks and
inductor's CUDA-graph skips. An arm whose estimate (the
slowest timed call so far per call, plus ``--compile-allowance-s`` for a compiled arm's first
call) does not fit the budget's time left is skipped; an arm stops its timed calls early (at
least one) when another would not fit; each arm runs in its own try/except, so one failure is
recorded and the next arm runs. The JSON (``results/bench_decode/<device>_<date>.json`` or
``--out-dir``) is written after every arm, with the device, date and commit. The arms' default
order puts the issue's comparison (hf_engine, its static decode, then the static compiled
``generate``) first, so a short budget drops the dynamic arm; the four arms with two
compilations want about twice the default budget.

Not covered: vLLM (no wheel on the GPU machine); rows that end early (EOS), which the HF engine's
dynamic decode drops from its batch and a static cache keeps; more than one process. Both static
arms make a new static cache every call, so their CUDA graphs are recorded again every call.
"""
from __future__ import annotations

import time

T_SCRIPT = time.time()

import argparse  # noqa: E402
import gc  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import zlib  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from gpu_check_record import Budget, Record  # noqa: E402

COMPILED_ARMS = ("hf_engine_static", "transformers_static_compiled")  # a compilation in their warm-up


def parse_args(argv):
    from gpu_check_cases import SHAPES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--budget-s", type=float, default=140.0, help="seconds from the process's start it may use")
    p.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=32, help="rows decoded together (distinct prompts)")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens every row generates")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls an arm")
    p.add_argument("--repeats", type=int, default=3, help="timed calls an arm (their median is reported)")
    p.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    p.add_argument("--compile-allowance-s", type=float, default=60.0,
                   help="what a compiled arm's warm-up (hf_engine_static, transformers_static_compiled) may add "
                        "to its estimate (compilation, CUDA graphs)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                   help="the model's dtype; default bfloat16 on a GPU, float32 on the CPU (bf16 is emulated there)")
    p.add_argument("--seed", type=int, default=0, help="the prompts' and the samplers' seed")
    p.add_argument("--out-dir", type=Path, default=REPO / "results" / "bench_decode")
    args = p.parse_args(argv)
    for name in ("batch", "prompt_tokens", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.peak_tflops = None  # stage 0 reads it; a decode's MFU is not reported here
    return args


def never_sampled(model) -> int:
    """An id no sampler can draw: the logits have ``vocab_size`` columns, numbered from 0."""
    return int(model.config.vocab_size)


def hf_engine_arm(decode: str):
    def build(model, prompts, args):
        """The HF engine: one seed per row, log-probs computed; ``decode`` its decode."""
        from ibpo_lit.rollout.engine import SamplingConfig
        from ibpo_lit.rollout.hf import HFRolloutEngine

        never = never_sampled(model)
        engine = HFRolloutEngine(model, eos_token_ids=[never], pad_token_id=never,
                                 sampling=SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens),
                                 decode=decode)
        rows = prompts.tolist()
        seeds = [args.seed + i for i in range(len(rows))]

        def call():
            batch = engine.generate(rows, 1, seeds)
            return batch.response_ids, int(batch.response_mask.sum())

        return call, {"per_row_seeds": True, "log_probs": True, "eos_token_ids": [never], "decode": decode,
                      "compiled_step": engine.compiles_step(model.device)}

    return build


def generate_arm(static: bool):
    def build(model, prompts, args):
        """transformers' ``generate``, sampling from the global generator seeded before each call."""
        import torch
        from transformers import CompileConfig

        never = never_sampled(model)
        ids = prompts.to(model.device)
        kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                      max_new_tokens=args.max_new_tokens, eos_token_id=never, pad_token_id=never)
        info = {"per_row_seeds": False, "log_probs": False, "eos_token_ids": [never]}
        if static:
            config = CompileConfig()  # transformers' defaults
            if model.device.type == "cpu":
                config._compile_all_devices = True  # generate compiles on accelerators only, unless this is set
            kwargs.update(cache_implementation="static", compile_config=config)
            info["compile_config"] = {**config.to_dict(), "backend": str(config.backend),
                                      "compile_all_devices": bool(config._compile_all_devices)}

        def call():
            torch.manual_seed(args.seed)
            out = model.generate(input_ids=ids, **kwargs)
            new = out[:, ids.shape[1]:]
            return new, int((new != never).sum())

        return call, info

    return build


def floor_arm(what: str):
    def build(model, prompts, args):
        """Not a decode: a lower bound of every decode of this model on this device, by the work no
        decode step can skip. Each call runs ``--max-new-tokens`` steps; a step is, for every weight
        matrix the decoding step multiplies (the ``nn.Linear`` modules: each layer's seven
        projections and the vocabulary head),
        ``matmuls``: ``F.linear`` of a [batch, in] activation with it, the forward's own op at the
        decode's shapes, and nothing else (no attention over the cache, norms, rotary, sampling,
        no prefill); ``reads``: the matrix read once (a sum), the memory traffic of a step whose
        weights do not fit the caches. Counted as the batch x steps token slots it stands for."""
        import torch
        import torch.nn.functional as F

        weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
        steps, batch = args.max_new_tokens, prompts.shape[0]
        inputs = {w.shape[1]: torch.randn(batch, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}

        def call():
            with torch.no_grad():
                for _ in range(steps):
                    for w in weights:
                        F.linear(inputs[w.shape[1]], w) if what == "matmuls" else w.sum()
            return torch.zeros(batch, steps, dtype=torch.long), batch * steps

        return call, {"floor": what, "weight_matrices": len(weights),
                      "weight_bytes": sum(w.numel() * w.element_size() for w in weights),
                      "per_row_seeds": False, "log_probs": False}

    return build


ARMS = {
    "hf_engine": hf_engine_arm("dynamic"),
    "hf_engine_static": hf_engine_arm("static"),
    "transformers_static_compiled": generate_arm(static=True),
    "transformers_dynamic": generate_arm(static=False),
    "floor_weight_matmuls": floor_arm("matmuls"),
    "floor_weight_reads": floor_arm("reads"),
}
DEFAULT_ARMS = [name for name in ARMS if not name.startswith("floor_")]  # the floors on request


def compile_counts() -> dict[str, int]:
    """torch's compile counters so far in this process: graphs dynamo compiled, graph breaks, and
    inductor's CUDA-graph skips (a compiled decode that could not use CUDA graphs: the reason is
    in the log) and recordings with non-static inputs."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
            "cudagraph_recorded_non_static_inputs": int(counters["inductor"]["cudagraph_recorded_non_static_inputs"])}


def since(before: dict[str, int]) -> dict[str, int]:
    now = compile_counts()
    return {k: now[k] - before[k] for k in now}


def nonzero(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "none"


def main(argv=None) -> dict:
    from gpu_check import bench_record

    args = parse_args(argv)
    work = {"shape": args.shape, "batch": args.batch, "prompt_tokens": args.prompt_tokens,
            "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "temperature": 1.0,
            "expected_tokens_per_call": args.batch * args.max_new_tokens}
    budget, env, record = bench_record(args, argv, {"work": work})
    out = record.path
    model, prompts = build(args)
    print(f"bench_decode: {env['device']}, {args.shape} ({args.dtype}), {args.batch} rows x {args.prompt_tokens} "
          f"prompt + {args.max_new_tokens} new tokens, writing {out}", flush=True)
    slowest = {"call_s": None}
    for name in args.arms:
        run_arm(name, model, prompts, args, budget, record, slowest)
    cases = {c["name"]: c for c in record.data["cases"] if c["status"] == "ran"}
    base = cases.get("hf_engine")
    if base is not None:
        for case in cases.values():
            case["speed_vs_hf_engine"] = case["tokens_per_s"] / base["tokens_per_s"]
    target = cases.get("transformers_static_compiled")
    for name in ("hf_engine", "hf_engine_static"):  # the goal: >= 1
        if name in cases and target is not None:
            record.data[f"{name}_over_static_compiled"] = cases[name]["tokens_per_s"] / target["tokens_per_s"]
    record.data["elapsed_s"] = budget.elapsed()
    record.write(complete=True)
    print(f"done in {budget.elapsed():.0f} s of {args.budget_s:.0f} -> {out}", flush=True)
    return record.data


def build(args):
    """The shape's Qwen3 with random weights (no download) in the run's dtype, in eval mode, and
    the prompts: [batch, prompt_tokens] random ids below the vocabulary size, from ``--seed``."""
    import torch

    from gpu_check_cases import build_model

    model = build_model(args.shape, seed=args.seed)
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    generator = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_tokens), generator=generator)
    return model, prompts


def run_arm(name: str, model, prompts, args, budget: Budget, record: Record, slowest: dict) -> None:
    import torch

    from gpu_check_cases import memory_stats, reset_memory, synchronize

    on_gpu = args.device == "cuda"
    compiled = name in COMPILED_ARMS
    expected = args.batch * args.max_new_tokens
    entry = {"name": name, "warmup": args.warmup, "repeats": args.repeats, "expected_tokens_per_call": expected}
    if slowest["call_s"] is not None:
        calls = args.repeats if compiled else args.warmup + args.repeats  # compiled: warm-up in the allowance
        estimate = calls * slowest["call_s"] + (args.compile_allowance_s if compiled else 0.0)
        entry["estimate_s"] = estimate
        if not budget.fits(estimate):
            record.case({**entry, "status": "skipped", "reason": f"estimated {estimate:.0f} s, {budget.left():.0f} s left"})
            print(f"{name}: skipped (estimated {estimate:.0f} s, {budget.left():.0f} s left)", flush=True)
            return
    started = budget.elapsed()
    try:
        call, info = ARMS[name](model, prompts, args)
        entry.update(info)
        reset_memory(on_gpu)

        def timed():
            synchronize(on_gpu)
            start = time.perf_counter()
            tokens, count = call()
            synchronize(on_gpu)
            seconds = time.perf_counter() - start
            crc = zlib.crc32(tokens.cpu().numpy().tobytes())
            return seconds, count, crc

        counts = compile_counts()
        warmup = [timed() for _ in range(args.warmup)]
        compile_warmup, counts = since(counts), compile_counts()
        runs = []
        for _ in range(args.repeats):
            if runs and not budget.fits(max(r[0] for r in runs)):
                entry["repeats_cut"] = f"{len(runs)} of {args.repeats}: {budget.left():.0f} s left"
                break
            runs.append(timed())
        seconds = [r[0] for r in runs]
        tokens = [r[1] for r in warmup + runs]
        median = statistics.median(seconds)
        entry.update(
            status="ran", wall_s=budget.elapsed() - started,
            warmup_s=[w[0] for w in warmup], warmup_total_s=sum(w[0] for w in warmup),
            seconds=seconds, median_s=median, tokens_per_call=tokens, all_calls_full=all(c == expected for c in tokens),
            tokens_per_s=statistics.median(r[1] for r in runs) / median,
            s_per_step=median / args.max_new_tokens,  # prefill included in the decodes' (not in a floor's)
            token_crcs=[r[2] for r in warmup + runs],
            compile_warmup=compile_warmup, compile_timed=since(counts),
            # transformers' compiled generate keeps its compiled forward on the model
            compiled_call=name == "transformers_static_compiled" and bool(getattr(model, "_compiled_call", None)),
            memory=memory_stats(on_gpu))
        slowest["call_s"] = max(slowest["call_s"] or 0.0, max(seconds))
    except Exception as e:  # one arm's failure (memory, a compile error) is a finding: the next runs
        record.case({**entry, "status": "failed", "reason": f"{type(e).__name__}: {e}"[:2000],
                     "traceback": traceback.format_exc()[-4000:]})
        print(f"{name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return
    finally:
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
    record.case(entry)
    full = "" if entry["all_calls_full"] else f", NOT ALL CALLS FULL: {entry['tokens_per_call']}"
    memory = f", peak {entry['memory']['peak_allocated_gib']:.1f} GiB" if entry["memory"] else ""
    print(f"{name}: {entry['median_s']:.3f} s a call (median of {len(seconds)}), {entry['tokens_per_s']:.0f} tokens/s, "
          f"warm-up {entry['warmup_total_s']:.1f} s, compile counts in warm-up {nonzero(compile_warmup)}, in timed "
          f"calls {nonzero(entry['compile_timed'])}"
          f"{memory}{full}", flush=True)


if __name__ == "__main__":
    main()
