"""``trainer.precision: auto`` and the warning for bf16 on a CPU that emulates it (issue 30, item
1): resolved from what the machine computes natively (the capability mocked both ways, and the
environment variables that make a newer CPU act as AVX2), the shipped CPU configs resolve it,
and an explicit choice is kept with a warning."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

from ibpo_lit import precision
from ibpo_lit.precision import cpu_bf16_support, resolve_precision, slow_bf16_settings

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cpu(monkeypatch):
    """``cpu(native=...)``: pretend the CPU has (or lacks) AVX512-BF16 and AMX."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")

    def set_native(native: bool, amx: bool = False) -> None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: native and amx)

    return set_native


def test_auto_is_bf16_only_where_the_cpu_computes_it(cpu):
    cpu(native=False)
    chosen, note = resolve_precision("auto", "cpu")
    assert chosen == "32-true" and "neither AVX512-BF16 nor AMX" in note and note.startswith("trainer.precision: auto -> 32-true")
    cpu(native=True, amx=True)
    assert resolve_precision("auto", "cpu") == ("bf16-mixed", "trainer.precision: auto -> bf16-mixed (this CPU has AMX)")
    cpu(native=True)
    assert resolve_precision("auto", "cpu")[0] == "bf16-mixed"


def test_an_imitated_avx2_machine_counts_as_avx2(cpu, monkeypatch):
    cpu(native=True, amx=True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu_bf16_support() == (False, "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN below AVX512-BF16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_amx")
    assert cpu_bf16_support()[0]
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert cpu_bf16_support() == (False, "ATEN_CPU_CAPABILITY=avx2 keeps PyTorch below AVX-512")


def test_explicit_choices_are_kept_and_only_auto_changes(cpu):
    cpu(native=False)
    for given in ("bf16-mixed", "32-true", "16-mixed", None, 32):
        assert resolve_precision(given, "cpu") == (given, None)


def test_bf16_asked_for_on_an_emulating_cpu_is_warned_about(cpu):
    cpu(native=False)
    warning = slow_bf16_settings("bf16-mixed", "cpu", {"model.dtype": "bfloat16", "model.rollout.vllm.dtype": "float32"})
    assert warning.startswith("trainer.precision=bf16-mixed, model.dtype=bfloat16 on a CPU without native bf16")
    assert "trainer.precision: auto" in warning
    assert slow_bf16_settings("32-true", "cpu", {"model.dtype": "float32"}) is None
    assert slow_bf16_settings("bf16-mixed", "gpu", {}) is None  # not a CPU question
    cpu(native=True)
    assert slow_bf16_settings("bf16-mixed", "cpu", {"model.dtype": "bfloat16"}) is None


def _cli(tmp_path, *overrides):
    from ibpo_lit.__main__ import main

    sys.argv = sys.argv[:1]
    return main(["--config", str(REPO / "configs" / "tiny.yaml"), "--trainer.default_root_dir", str(tmp_path),
                 "--trainer.enable_progress_bar", "false", *overrides], run=False)


@pytest.mark.parametrize("native, expected", [(False, "32-true"), (True, "bf16-mixed")])
def test_the_command_line_resolves_auto_before_lightning_sees_it(tmp_path, cpu, native, expected):
    cpu(native=native, amx=native)
    cli = _cli(tmp_path, "--trainer.precision", "auto")
    assert cli.trainer.precision == expected


def test_the_command_line_warns_for_bf16_on_an_emulating_cpu(tmp_path, cpu):
    cpu(native=False)
    with pytest.warns(UserWarning, match=r"trainer.precision=bf16-mixed on a CPU without native bf16"):
        cli = _cli(tmp_path, "--trainer.precision", "bf16-mixed")
    assert cli.trainer.precision == "bf16-mixed"  # respected
    cpu(native=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*without native bf16.*")
        _cli(tmp_path, "--trainer.precision", "bf16-mixed")


@pytest.mark.parametrize("config", ["smollm2_135m_cpu.yaml", "smollm2_mbpp_cpu.yaml"])
def test_the_shipped_cpu_configs_ask_for_auto(config):
    import yaml

    trainer = yaml.safe_load((REPO / "configs" / config).read_text())["trainer"]
    assert trainer["accelerator"] == "cpu" and trainer["precision"] == "auto"
