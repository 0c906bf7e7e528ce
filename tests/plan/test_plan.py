"""`python -m ibpo_lit plan` on the shipped configs, the verdicts it gives, and `fit` refusing a
config whose plan fails (unless ``plan.check: false``). The arithmetic against measurements is
tests/plan/test_plan_measured.py."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from ibpo_lit.__main__ import IBPOCLI, main
from ibpo_lit.errors import ConfigError
from ibpo_lit.models.known_configs import known_config
from ibpo_lit.plan import memory
from ibpo_lit.plan.cli import plan_for_config, plan_main
from ibpo_lit.plan.memory import GIB
from ibpo_lit.plan.plan import PlanSettings, build_plan
from ibpo_lit.plan.shapes import ModelShape
from plan_fixtures import run_shape

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
GPU_CONFIGS = ("qwen3_32b.yaml", "qwen3_next_80b.yaml", "qwen3_8b_8gpu.yaml", "qwen2p5_1p5b_gsm8k_1gpu.yaml")


def config(name: str) -> str:
    return os.path.join(ROOT, "configs", name)


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_every_shipped_gpu_config_passes_its_own_plan(name, capsys):
    assert plan_main(["--config", config(name)]) == 0
    out = capsys.readouterr().out
    assert "verdict: fits" in out and "DOES NOT FIT" not in out
    for phase in ("rollout", "weight sync", "corrections", "update"):
        assert f"\n{phase} " in out


def test_the_32b_plan_in_numbers():
    plan = plan_for_config(["--config", config("qwen3_32b.yaml")])
    shape = plan.model
    assert 32.5e9 < shape.params < 33e9 and shape.active_params == shape.params and shape.head_params > 0
    update = next(p for p in plan.phases if p.name == "update")
    # FSDP2 over 32: 4 bytes of master weight, 4 of gradient, 8 of AdamW per parameter, / 32
    assert update.parts["parameters"] == shape.params * 4 / 32
    assert update.parts["optimizer (AdamW)"] == 2 * update.parts["parameters"]
    # correction rows (trained jointly) fill the engine's 40960 tokens: the longest row
    assert update.parts["activations (longest micro-batch)"] == shape.activation_bytes(40960, 2, True)
    assert plan.candidate_tokens == (40960 - 8192 - 2048 - memory.CORRECTION_TEMPLATE_TOKENS) // 2
    assert all(p.total < 79.2 * GIB for p in plan.phases)
    assert plan.needed_timeout_s <= plan.run.timeout_s


def test_the_async_line_is_the_longer_of_generation_and_update_plus_the_sync(capsys):
    from ibpo_lit.plan.constants import WEIGHT_SYNC_GB_PER_S

    plan = plan_for_config(["--config", config("qwen3_32b.yaml")])
    seconds = {p.name: p.seconds for p in plan.phases}
    # a bf16 copy of the weights at the stated rate
    assert seconds["weight sync"] == pytest.approx(plan.model.params * 2 / (WEIGHT_SYNC_GB_PER_S.value * 1e9))
    generation = seconds["rollout"] + seconds["corrections"]
    assert generation > seconds["update"]  # the 32B config: generation-bound
    assert plan.async_step_s == pytest.approx(generation + seconds["weight sync"])
    assert plan.async_step_s < sum(seconds.values())  # synchronous: the sum of every phase
    fast = plan_for_config(["--config", config("qwen3_32b.yaml"), "--plan.decode_tokens_per_s", "6000"])
    fast_update = next(p.seconds for p in fast.phases if p.name == "update")
    assert fast.async_step_s == pytest.approx(fast_update + seconds["weight sync"])  # now update-bound
    assert plan_main(["--config", config("qwen3_32b.yaml")]) == 0
    assert "one step off-policy, the engine on 32 more GPUs: max(generation 21.6 min, update 8.7 min) + sync 7 s " \
        "= 21.7 min" in capsys.readouterr().out


def test_a_token_budget_shrinks_the_longest_micro_batch():
    shape = plan_for_config(["--config", config("qwen3_8b_8gpu.yaml")]).model
    base = run_shape(micro_batch_size=8)
    full = memory.backward_transients(shape, base, 128)
    # 300 tokens hold 2 rows of 128 (counted padded); a budget under one row still runs it alone
    for budget, rows in ((None, 8), (10_000, 8), (300, 2), (50, 1)):
        parts = memory.backward_transients(shape, run_shape(micro_batch_size=8, micro_batch_tokens=budget), 128)
        assert parts["activations (longest micro-batch)"] == shape.activation_bytes(rows * 128, 4, False)
        assert parts["log-prob head chunk"] == full["log-prob head chunk"] * rows / 8
    plan = plan_for_config(["--config", config("qwen3_8b_8gpu.yaml"), "--model.rollout.micro_batch_tokens", "1"])
    assert plan.run.micro_batch_tokens == 1 and plan.run.micro_batch_rows(10) == 1


def test_a_vllm_server_is_not_counted_on_the_trainers_gpus(capsys):
    args = ["--config", config("qwen3_32b.yaml"), "--model.rollout.backend", "vllm_server"]
    server, colocated = plan_for_config(args), plan_for_config(["--config", config("qwen3_32b.yaml")])
    phases = {p.name: p for p in server.phases}
    state = memory.trainer_state(server.model, server.run, with_grads=False)
    assert phases["rollout"].parts == state and phases["corrections"].parts == state  # no engine, no HF KV cache
    assert "engine weights" not in phases["weight sync"].parts
    assert phases["weight sync"].seconds == next(p.seconds for p in colocated.phases if p.name == "weight sync")
    assert "vLLM asleep (CUDA-graph pool, NCCL buffers)" not in phases["update"].parts
    assert plan_main(args) == 0
    assert "a vLLM server on GPUs of its own" in capsys.readouterr().out


def test_the_80b_moe_counts_active_parameters_and_does_not_fit_80gb():
    plan = plan_for_config(["--config", config("qwen3_next_80b.yaml"), "--plan.gpu_memory_gib", "80"])
    assert plan.model.active_params < plan.model.params / 15  # ~3.9B of ~80B
    problems = plan.problems()
    assert any("update phase needs" in p for p in problems), problems
    assert plan_main(["--config", config("qwen3_next_80b.yaml"), "--plan.gpu_memory_gib", "80"]) == 1


def test_a_plan_that_fails_names_what_to_change(capsys):
    argv = ["--config", config("qwen3_32b.yaml"), "--model.rollout.vllm.max_model_len", "32768",
            "--model.rollout.vllm.gpu_memory_utilization", "0.95", "--trainer.strategy.init_args.timeout", "0:30:00"]
    assert plan_main(argv) == 1
    out = capsys.readouterr().out
    assert "rollout phase needs" in out  # 0.95 of the GPU for vLLM beside the trainer's shards
    assert "plan.min_candidate_fraction" in out and "model.rollout.vllm.max_model_len" in out
    assert "trainer.strategy.init_args.timeout" in out


def test_kv_cache_that_holds_no_sequence_is_refused():
    shape = ModelShape.from_config(known_config("Qwen/Qwen3-32B"))
    run = run_shape(processes=8, sharded=True, compute_bytes=2, backend="vllm", tensor_parallel=1, engine_bytes=2,
                    gpu_memory_utilization=0.5, max_new_tokens=30720, max_prompt_tokens=2048, on_gpu=True)
    plan = build_plan(shape, run, PlanSettings(gpu_memory_gib=80))
    rollout = plan.phases[0]
    assert not rollout.fits and any("cannot hold one sequence" in n for n in rollout.notes)


def test_more_processes_shard_the_state_and_one_process_holds_it_all():
    shape = ModelShape.from_config(known_config("Qwen/Qwen3-8B"))
    one = memory.trainer_state(shape, run_shape(processes=1), with_grads=True)
    eight = memory.trainer_state(shape, run_shape(processes=8, sharded=True), with_grads=True)
    assert one["parameters"] == 8 * eight["parameters"]
    ddp = memory.trainer_state(shape, run_shape(processes=8, sharded=False), with_grads=True)
    assert ddp["parameters"] == one["parameters"] and "DDP gradient buckets" in ddp


def _instantiate(monkeypatch, name, *overrides):
    """`fit`'s classes and checks, with the Trainer (which would need GPUs) a record of its settings."""
    def record_trainer(self, **kwargs):
        config_ = self.config_init[self.subcommand] if self.subcommand else self.config_init
        trainer = SimpleNamespace(**dict(config_["trainer"]))
        trainer.num_devices = trainer.devices
        return trainer

    monkeypatch.setattr(IBPOCLI, "instantiate_trainer", record_trainer)
    return main(["--config", config(name), "--data.train_path", "null", "--data.val_path", "null", *overrides],
                run=False)


def test_fit_refuses_a_config_whose_plan_fails(monkeypatch):
    with pytest.raises(ConfigError, match=r"rollout phase needs .* GiB of the GPU's 79\.2 GiB"):
        _instantiate(monkeypatch, "qwen3_32b.yaml", "--model.rollout.vllm.gpu_memory_utilization", "0.95")


def test_plan_check_false_runs_anyway_with_a_warning(monkeypatch):
    with pytest.warns(UserWarning, match="rollout phase needs"):
        _instantiate(monkeypatch, "qwen3_32b.yaml", "--model.rollout.vllm.gpu_memory_utilization", "0.95",
                     "--plan.check", "false")


def test_the_correction_budget_is_checked_on_the_cpu_too(monkeypatch):
    # tiny.yaml: the HF engine on the CPU; 5000-token rollouts and 5000-token corrections leave
    # a correction prompt in the tiny model's 8192-token context room for ~1500 tokens of each
    with pytest.raises(ConfigError, match="correction prompt keeps 1484 tokens of each 5000-token candidate"):
        _instantiate(monkeypatch, "tiny.yaml", "--model.rollout.sampling.max_new_tokens", "5000",
                     "--data.max_prompt_tokens", "64")


def test_plan_command_runs_as_users_type_it():
    done = subprocess.run([sys.executable, "-m", "ibpo_lit", "plan", "--config", "configs/qwen3_32b.yaml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "plan for 32 GPUs of 79.2 GiB" in done.stdout and "verdict: fits" in done.stdout
    assert "GPU constants no GPU has measured yet" in done.stdout
    assert "LightningCLI's args parameter" not in done.stderr
