"""``trainer.precision: auto``: the fast precision for the machine the run is on.

bf16 is fast only where the hardware computes it. On a CPU that means AVX512-BF16 or AMX on
x86 (oneDNN's bf16 kernels) or the BF16 extension on Arm; elsewhere (AVX2-only x86, many cloud
VMs and laptops) PyTorch emulates it: a 1024x1024 bf16 matmul ran at 0.3 GFLOP/s against
20.5 GFLOP/s in fp32 on one such machine (shared/docs/FACTS.md), and the SmolLM2 quick start
had not finished step 0 after 20 minutes. So:

- ``auto`` resolves to ``bf16-mixed`` on a CPU with native bf16 and on a CUDA device that
  supports it, and to ``32-true`` elsewhere, with one log line saying which and why;
- an explicit bf16 choice (``trainer.precision``, ``model.dtype``, ``model.rollout.vllm.dtype``)
  on a CPU without native bf16 is respected, with a warning that it will be slow.

What counts as native is read from PyTorch's own CPU feature probe (``torch.cpu``), and narrowed
by the two variables that make PyTorch and oneDNN use an older instruction set
(``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``): a machine told to act as AVX2 is treated as
AVX2. That is also how a test or a user imitates an AVX2 machine on a newer one.

Not covered: fp16 (``16-mixed`` needs a gradient scaler; ``auto`` never picks it); Apple's MPS
(``auto`` is ``32-true`` there).
"""
from __future__ import annotations

import os
import platform
from typing import Optional, Union

AUTO = "auto"
BF16_PRECISIONS = ("bf16-mixed", "bf16-true", "bf16")

# oneDNN instruction sets (ONEDNN_MAX_CPU_ISA values) that include bf16 dot products.
_ONEDNN_BF16_ISAS = {
    "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "ALL", "DEFAULT",
}


def cpu_bf16_support() -> tuple[bool, str]:
    """``(native, why)``: whether this CPU computes bf16 natively, and the reason in a few words."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if isa and isa not in _ONEDNN_BF16_ISAS:
        return False, f"ONEDNN_MAX_CPU_ISA={isa} keeps oneDNN below AVX512-BF16"
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if capability and capability not in ("default", "avx512", "avx512_bf16", "amx"):
        return False, f"ATEN_CPU_CAPABILITY={capability} keeps PyTorch below AVX-512"
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        # Arm's BF16 extension (Graviton 3+, Neoverse V1/N2+) shows as the "bf16" feature.
        if "bf16" in _cpuinfo_flags():
            return True, "this CPU has the Arm BF16 extension"
        return False, "this Arm CPU has no BF16 extension"
    import torch

    probe = getattr(torch, "cpu", None)
    amx = bool(getattr(probe, "_is_amx_tile_supported", lambda: False)())
    avx512_bf16 = bool(getattr(probe, "_is_avx512_bf16_supported", lambda: False)())
    if amx or avx512_bf16:
        return True, f"this CPU has {'AMX' if amx else 'AVX512-BF16'}"
    return False, "this CPU has neither AVX512-BF16 nor AMX, so bf16 is emulated (~70x slower than fp32)"


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return set()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def runs_on_cpu(accelerator: object) -> bool:
    """Whether ``trainer.accelerator`` puts the run on the CPU (``auto``: when there is no GPU)."""
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    name = (name or "auto").lower()
    if name.startswith("cpu"):
        return True
    if name == "auto":
        import torch

        return not torch.cuda.is_available()
    return False


def resolve_precision(precision: Union[str, int, None], accelerator: object) -> tuple[Union[str, int, None], Optional[str]]:
    """``(precision for Lightning, a line to log or None)``. Only ``auto`` changes; see the module docstring."""
    if precision != AUTO:
        return precision, None
    if runs_on_cpu(accelerator):
        native, why = cpu_bf16_support()
        chosen = "bf16-mixed" if native else "32-true"
        return chosen, f"trainer.precision: auto -> {chosen} ({why})"
    import torch

    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed", "trainer.precision: auto -> bf16-mixed (the GPU supports bf16)"
    return "32-true", "trainer.precision: auto -> 32-true (no device with bf16 support)"


def slow_bf16_settings(precision: Union[str, int, None], accelerator: object, dtypes: dict[str, str]) -> Optional[str]:
    """A warning when the run asks for bf16 on a CPU that emulates it; None otherwise.

    ``dtypes`` maps other settings to their value (``{"model.dtype": "bfloat16"}``).
    """
    if not runs_on_cpu(accelerator):
        return None
    asked = [f"{key}={value}" for key, value in dtypes.items() if value in ("bfloat16", "bf16")]
    if str(precision) in BF16_PRECISIONS:
        asked.insert(0, f"trainer.precision={precision}")
    if not asked:
        return None
    native, why = cpu_bf16_support()
    if native:
        return None
    return (f"{', '.join(asked)} on a CPU without native bf16 ({why}): expect every step to be many times "
            "slower than in float32; trainer.precision: auto (or 32-true) and float32 dtypes are fast here")
