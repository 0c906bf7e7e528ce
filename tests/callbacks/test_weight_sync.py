"""VLLMWeightSync: the probe catches an engine holding stale weights; a vLLM fit syncs before
its first rollout (resume included), after every step, and its engine agrees with the trainer."""
import copy
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from callbacks import StaleWeightsError, VLLMWeightSync
from ibpo_lit.rollout.weights import WeightSyncContext, iter_full_weights
from ibpo_lit.scale.collectives import SINGLE_PROCESS

pytestmark = pytest.mark.xdist_group("tiny_vllm")  # the session's engine (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def context(engine, model, tokenizer, version=0, num_mini_batches=1):
    return WeightSyncContext(engine=engine, policy=model, tokenizer=tokenizer, weights_version=version,
                             num_mini_batches=num_mini_batches, device=torch.device("cpu"), sync=SINGLE_PROCESS)


def module_like(*args, **kwargs):
    """All the callback reads of the module: its weight-sync context."""
    ctx = context(*args, **kwargs)
    return SimpleNamespace(weight_sync_context=lambda: ctx)


def test_probe_fails_loudly_on_stale_weights_and_passes_after_sync(tiny_vllm):
    engine, model, tokenizer = tiny_vllm
    sync = VLLMWeightSync(probe_tokens=16, probe_tolerance=0.01)
    try:
        sync.sync_engine(context(engine, model, tokenizer))
        assert sync.last_probe_mismatch < 1e-4 and sync.synced_version == 0

        changed = copy.deepcopy(model)
        with torch.no_grad():
            for p in changed.parameters():
                p.mul_(1.5)
        stale = context(engine, changed, tokenizer, version=1)
        with pytest.raises(StaleWeightsError, match="stale or wrongly loaded weights"):
            sync.check_probe(stale)  # the engine still has the old weights
        sync.sync_engine(stale)
        assert sync.last_probe_mismatch < 1e-4 and sync.synced_version == 1 and sync.syncs == 2
    finally:
        engine.sync_weights(iter_full_weights(model))


def test_every_rank_takes_the_worst_ranks_verdict(tiny_vllm):
    # Another process's probe failed: this one raises too, instead of going on alone into a
    # collective the failed one never reaches.
    engine, model, tokenizer = tiny_vllm
    sync = VLLMWeightSync(probe_tokens=8, probe_tolerance=0.01)
    ctx = context(engine, model, tokenizer)
    sync.sync_engine(ctx)  # this process alone: in tolerance
    other_failed = dataclasses.replace(ctx, sync=SimpleNamespace(gather=lambda mine: [mine, 0.5]))
    with pytest.raises(StaleWeightsError, match=r"by 0.5000 per token \(process 1 of 2\)"):
        sync.check_probe(other_failed)
    other_nan = dataclasses.replace(ctx, sync=SimpleNamespace(gather=lambda mine: [mine, float("nan")]))
    with pytest.raises(StaleWeightsError, match=r"nan per token \(process 1 of 2\)"):
        sync.check_probe(other_nan)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="every_n_steps"):
        VLLMWeightSync(every_n_steps=0)
    with pytest.raises(ValueError, match="probe_tolerance"):
        VLLMWeightSync(probe_tolerance=0)


def _scalars(root: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(root.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


@pytest.mark.slow
def test_tiny_vllm_fit_syncs_every_step_and_on_resume(tmp_path, tiny_vllm):
    # (tiny_vllm only to skip without vLLM: the fit runs in its own process)
    def fit(*extra):
        cmd = [sys.executable, "-m", "ibpo_lit", "fit", "--config", str(ROOT / "configs/tiny_vllm.yaml"),
               "--trainer.default_root_dir", str(tmp_path), *extra]
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr[-3000:]

    fit("--trainer.max_steps", "2")
    last = tmp_path / "checkpoints" / "last.ckpt"
    state = torch.load(last, weights_only=False)
    sync_state = next(v for k, v in state["callbacks"].items() if "VLLMWeightSync" in k)
    assert sync_state == {"synced_version": 2, "syncs": 3}  # fit start + after each of 2 steps

    fit("--trainer.max_steps", "3", "--ckpt_path", str(last))
    state = torch.load(last, weights_only=False)
    sync_state = next(v for k, v in state["callbacks"].items() if "VLLMWeightSync" in k)
    assert state["ibpo_lit"]["update"]["weights_version"] == 3
    assert sync_state == {"synced_version": 3, "syncs": 5}  # + a forced sync at resume, + step 3

    scalars = _scalars(tmp_path / "lightning_logs")
    mismatch = [v for _, v in scalars["rollout/logprob_mismatch"]]
    assert len(mismatch) == 3 and max(mismatch) < 1e-3  # fp32 engine on synced weights
    assert all(v < 0.01 for _, v in scalars["rollout/probe_mismatch"])
    assert all(v > 0 for _, v in scalars["rollout/sync_s"])


def test_a_restored_checkpoint_does_not_mark_the_new_engine_as_synced(tiny_vllm):
    # Under FSDP2 Lightning restores callbacks after on_fit_start: the saved version must not
    # make the fresh engine look synced, or the first rollouts come from its start-up weights.
    engine, model, tokenizer = tiny_vllm
    sync = VLLMWeightSync(probe_tokens=4, probe_tolerance=0.01)
    module = module_like(engine, model, tokenizer, version=7)
    sync.on_fit_start(None, module)
    sync.load_state_dict({"synced_version": 7, "syncs": 9})  # the restore, after on_fit_start
    assert sync.synced_version is None and sync.syncs == 9
    sync.on_train_start(None, module)
    assert sync.synced_version == 7 and sync.syncs == 10 and sync.last_probed
    sync.on_train_start(None, module)  # already on these weights: no second sync
    assert sync.syncs == 10


def test_probe_every_n_syncs_checks_the_first_sync_of_a_fit_then_every_nth(tiny_vllm, monkeypatch):
    engine, model, tokenizer = tiny_vllm
    sync = VLLMWeightSync(probe_tokens=4, probe_tolerance=0.01, probe_every_n_syncs=3)
    probed = []
    real_check = sync.check_probe
    monkeypatch.setattr(sync, "check_probe", lambda m: probed.append(sync.syncs) or real_check(m))
    module = module_like(engine, model, tokenizer)
    sync.on_fit_start(None, module)
    sync.on_train_start(None, module)  # sync 1 of this fit: probed
    for _ in range(4):  # syncs 2-5: the 4th sync is probed (every 3rd after the first)
        sync.sync_engine(module.weight_sync_context())
    assert probed == [1, 4]
    assert [sync.last_probed, sync.syncs, sync.fit_syncs] == [False, 5, 5]
    sync.on_fit_start(None, module)  # a new fit (e.g. a resume) probes its first sync again
    sync.on_train_start(None, module)
    assert probed == [1, 4, 6] and sync.last_probed and sync.last_probe_mismatch < 1e-4
    with pytest.raises(ValueError, match="probe_every_n_syncs"):
        VLLMWeightSync(probe_every_n_syncs=0)


def test_every_tensor_reaches_the_engine_one_at_a_time(tiny_vllm):
    """Perturb one tensor of the policy at a time (embedding, every projection and norm, the
    final norm, the tied head): after a sync the engine's log-probs follow the trainer's each
    time, so no tensor is left stale. A sync that skipped any one of them would leave the
    engine on the old value of that tensor: the mismatch would stay large."""
    engine, model, tokenizer = tiny_vllm
    sync = VLLMWeightSync(probe_tokens=12, probe_tolerance=0.01)
    names = [name for name, _ in iter_full_weights(model)]
    assert "model.embed_tokens.weight" in names and "model.norm.weight" in names
    try:
        for name in names:
            changed = copy.deepcopy(model)
            with torch.no_grad():
                tensor = changed.get_parameter(name)
                tensor.add_(torch.randn(tensor.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
            stale = context(engine, changed, tokenizer, version=1)
            with pytest.raises(StaleWeightsError):
                sync.check_probe(stale)  # the engine has not seen the change yet
            sync.sync_engine(stale)
            assert sync.last_probe_mismatch < 1e-4, name
    finally:
        engine.sync_weights(iter_full_weights(model))


class _RecordingEngine:
    """An engine that records what it is asked; vLLM's sleep mode exists only on GPUs."""

    can_sleep = True

    def __init__(self, consume_all=True):
        self.calls, self.asleep, self.weights_discarded, self.consume_all = [], 0, False, consume_all

    def sleep(self, level):
        self.calls.append(("sleep", level))
        self.asleep, self.weights_discarded = level, level == 2

    def sync_weights(self, named):
        self.calls.append(("sync",))
        for i, _ in enumerate(named):
            if not self.consume_all and i == 2:
                break
        self.asleep, self.weights_discarded = 0, False


def _module(engine, model, version, num_mini_batches=1):
    return module_like(engine, model, None, version=version, num_mini_batches=num_mini_batches)


def test_sleep_drops_the_weights_only_when_a_sync_follows():
    from ibpo_lit.models import build_tiny_model

    model = build_tiny_model(seed=0)
    engine = _RecordingEngine()
    every_step = VLLMWeightSync(every_n_steps=1, probe_tokens=0)
    every_step.synced_version = 0
    every_step.on_before_update(None, _module(engine, model, 0), None)
    assert engine.calls == [("sleep", 2)]  # this update's weights will be synced: drop the old ones

    engine = _RecordingEngine()
    lagging = VLLMWeightSync(every_n_steps=3, probe_tokens=0)
    lagging.synced_version = 0
    lagging.on_before_update(None, _module(engine, model, 0), None)
    assert engine.calls == [("sleep", 1)]  # the engine keeps sampling these weights afterwards

    # A skipped (non-finite) step leaves the version as it was, but dropped weights are synced anyway.
    engine = _RecordingEngine()
    every_step.on_before_update(None, _module(engine, model, 0), None)
    trainer = SimpleNamespace(loggers=[], global_step=1)
    every_step.on_train_batch_end(trainer, _module(engine, model, 0), None, None, 0)
    assert engine.calls == [("sleep", 2), ("sync",)]


def test_a_sync_that_does_not_send_every_tensor_is_an_error():
    from ibpo_lit.models import build_tiny_model

    sync = VLLMWeightSync(probe_tokens=0)
    with pytest.raises(StaleWeightsError, match="did not send"):
        sync.sync_engine(context(_RecordingEngine(consume_all=False), build_tiny_model(seed=0), None))


def test_the_module_hands_over_what_a_sync_needs():
    from ibpo_lit.config import RolloutConfig
    from ibpo_lit.module import IBPOModule

    module = IBPOModule(rollout=RolloutConfig(num_mini_batches=2))
    module.configure_model()
    module.updater.load_state_dict({"weights_version": 3})
    ctx = module.weight_sync_context()
    assert ctx.engine is module.engine and ctx.policy is module.policy and ctx.tokenizer is module.tokenizer
    assert (ctx.weights_version, ctx.num_mini_batches, ctx.device, ctx.sync.world_size) == (3, 2, torch.device("cpu"), 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.weights_version = 4  # a view: the callback cannot move the module's counters


def test_the_probe_forward_runs_in_the_trainers_precision_context(tiny_vllm):
    """Under bf16-mixed with one device or DDP the update's forward is autocast's: the probe's
    trainer side is computed in that context (the module hands over its precision plugin's
    ``forward_context``), so it compares the engine with what the update computes."""
    from contextlib import contextmanager

    engine, model, tokenizer = tiny_vllm
    entered = []

    @contextmanager
    def forward_context():
        entered.append(True)
        yield

    ctx = dataclasses.replace(context(engine, model, tokenizer), forward_context=forward_context)
    sync = VLLMWeightSync(probe_tokens=4)
    assert sync.check_probe(ctx) < sync.probe_tolerance
    assert entered == [True]


def test_the_module_hands_over_the_trainers_precision_context(tmp_path):
    import lightning as L

    from ibpo_lit.module import IBPOModule

    module = IBPOModule()
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", logger=False, default_root_dir=tmp_path)
    module.trainer = trainer
    module.configure_model()
    with module.weight_sync_context().forward_context():
        assert torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")
