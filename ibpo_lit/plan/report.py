"""The plan as text: what ``python -m ibpo_lit plan`` prints."""
from __future__ import annotations

import textwrap

from ibpo_lit.plan.constants import unmeasured
from ibpo_lit.plan.memory import GIB


def gib(value: float) -> str:
    """A GPU's memory as the plan prints it: 80, 79.2, 141."""
    return f"{round(value, 1):g}"


def _b(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def _time(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def render(plan) -> str:
    m, r, s = plan.model, plan.run, plan.settings
    strategy = f"FSDP2 over {r.processes}" if r.sharded else ("DDP" if r.processes > 1 else "one process")
    engine = {"vllm": f"vLLM TP{r.tensor_parallel}", "vllm_server": "a vLLM server on GPUs of its own"}.get(
        r.backend, "HF engine")
    lines = [
        f"plan for {r.processes} GPU{'s' if r.processes > 1 else ''} of {gib(plan.device_gib)} GiB "
        f"({plan.device_source}), {strategy}, {engine}",
        f"model: {_b(m.params)} parameters, {_b(m.active_params)} active a token, largest layer {_b(m.layer_params)}, "
        f"context {plan.context or 'unknown'}",
        f"step a GPU: {r.prompts_per_rank} prompt(s) x {r.group_size} rollouts of up to "
        f"{r.max_prompt_tokens}+{r.max_new_tokens} tokens",
        "",
        f"{'phase / part':<44}{'GiB a GPU':>10}  verdict",
    ]
    for phase in plan.phases:
        verdict = "fits" if phase.fits else "DOES NOT FIT"
        lines.append(f"{phase.name:<44}{phase.total / GIB:>10.1f}  {verdict}")
        for name, value in phase.parts.items():
            lines.append(f"  {name:<42}{value / GIB:>10.2f}")
        lines.append(f"  {'overhead (plan.overhead_gib)':<42}{s.overhead_gib:>10.2f}")
        for note in phase.notes:
            lines.append(f"  - {note}")
    lines.append("")
    if plan.candidate_tokens is not None:
        verdict = "ok" if plan.candidate_fraction >= s.min_candidate_fraction else "REFUSED"
        whole = "whole" if plan.candidate_fraction >= 1 else f"{plan.candidate_fraction:.0%}, the middle cut"
        lines.append(f"corrections: the prompt keeps {max(plan.candidate_tokens, 0)} tokens of each "
                     f"{r.max_new_tokens}-token candidate ({whole}); minimum {s.min_candidate_fraction:.0%}: {verdict}")
    times = [(p.name, p.seconds) for p in plan.phases if p.seconds is not None]
    lines.append("time a step (worst case): " + " + ".join(f"{n} {_time(t)}" for n, t in times)
                 + f" = {_time(sum(t for _, t in times))}"
                 + f"  [decode {s.decode_tokens_per_s:g} tokens/s a sequence; update {plan.step_flops / 1e15:.1f} PFLOP "
                 f"at {s.mfu:.0%} of {plan.peak_tflops:.0f} TFLOP/s]")
    generation, update = plan.seconds("rollout", "corrections"), plan.seconds("update")
    lines.append(f"one step off-policy, the engine on {r.processes} more GPU{'s' if r.processes > 1 else ''}: "
                 f"max(generation {_time(generation)}, update {_time(update)}) + sync "
                 f"{_time(plan.seconds('weight sync'))} = {_time(plan.async_step_s)}"
                 + (f"; on these {r.processes} split between engine and trainer at best {_time(generation + update)} "
                    "(no gain in time: the split saves the sleeping engine's memory)" if r.processes > 1 else ""))
    verdict = "ok" if plan.needed_timeout_s <= r.timeout_s or r.processes == 1 else "TOO SHORT"
    lines.append(f"collective timeout: needs {_time(plan.needed_timeout_s)}, "
                 f"trainer.strategy has {_time(r.timeout_s)}: {verdict}")
    problems = plan.problems()
    lines.append("")
    lines.append("verdict: fits" if not problems else "verdict: " + str(len(problems)) + " problem(s)\n  - "
                 + "\n  - ".join(problems))
    if not r.on_gpu:
        lines.append("(trainer.accelerator is not a GPU: fit checks only the correction budget)")
    lines.append("GPU constants no GPU has measured yet (ibpo_lit/plan/constants.py, docs/scaling.md):")
    lines.extend(textwrap.wrap(", ".join(unmeasured()), width=100, initial_indent="  ", subsequent_indent="  "))
    return "\n".join(lines)
