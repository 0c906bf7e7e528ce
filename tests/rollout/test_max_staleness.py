"""One step off-policy generation, ``model.rollout.max_staleness: 1`` (issue 44 item 3;
``ibpo_lit.training.off_policy``).

Without a server (seconds): the setting's own check and the cross-section ones; the staleness
arithmetic and its assertion; the producer thread handing back its result or its error; the batch
in flight through a checkpoint (``torch.load(weights_only=True)``) and back, every field; the data
module's look-ahead (each step's prompts with the next's, only the first consumed, resumed
exactly).

With the real vLLM server (``backend: vllm_server``, the tiny model, fp32; the session's server,
one test): a 2-step fit against a fit SIGKILLed (in a process of its own, mid-step, its
thread generating ahead) once its checkpoint holds step 1, then resumed to 2. The batches lag by
exactly one update after the first, the next step's generation starts before the update ends
(timestamps), the checkpoint holds the next step's finished batch, the resumed run trains on it
(with the load switched off it samples again with newer weights and the test fails) and ends
where the uninterrupted one does, bitwise. On 2 processes (FSDP2, the same server): a 3-step
off-policy fit (its threads' collectives over a group of their own), the lag agreed and the
overlap shown on every rank, every metric declared, each rank's batch in the checkpoint; and
the same with ``max_staleness: 0``, unchanged. And 2 processes SIGKILLed (the process group)
once the checkpoint holds step 1, each rank's thread generating step 2, then resumed to 3: every
rank trains exactly the unbroken run's batches (step, weights version, prompts, texts; the first
its own from the checkpoint, bitwise), lag 1, and ends at its weights (to the server's rounding:
its log-probs depend on what it batches each request with). The unbroken 2-process run is one
fixture both tests read. Skipped without vLLM.

``max_staleness: 0`` is the code path of before (``IBPOModule.training_step`` returns into
``_off_policy_step`` only when it is set): the existing fit, resume and equivalence tests cover it.
"""
from __future__ import annotations

import io
import math
import os
import signal
import subprocess
import sys
import time

import lightning as L
import pytest
import torch

from ibpo_lit.config import RolloutConfig
from ibpo_lit.config_checks import off_policy_fits, off_policy_spin_warning
from ibpo_lit.data.lookahead import StepPrompts, steps_with_lookahead
from ibpo_lit.data.prompt import Prompt
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.off_policy import (
    AheadOfUpdate,
    Produced,
    StalenessError,
    check_ranks_agree,
    check_staleness,
    in_flight_from_state,
    in_flight_state,
    staleness,
)
from ibpo_lit.training.step_types import Corrections, ScoredRollouts
from tiny_server import GROUP

pytestmark = pytest.mark.xdist_group(GROUP)  # the session's vLLM server, shared with test_vllm_server.py

TINY_VLLM = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny_vllm.yaml")


# ----------------------------------------------------------------------------------- settings
def test_only_lags_0_and_1_are_accepted():
    assert RolloutConfig(max_staleness=1).max_staleness == 1
    with pytest.raises(ValueError, match="rollout.max_staleness must be 0 .* or 1"):
        RolloutConfig(max_staleness=2)


class _Sync:  # a weight-sync callback as config_checks sees one (it has `sync_engine`)
    def __init__(self, every_n_steps=1):
        self.every_n_steps = every_n_steps

    def sync_engine(self, ctx):
        pass


def _problem(**overrides):
    args = dict(max_staleness=1, backend="vllm_server", correction_on=True, processes=1, dynamic_sampling=False,
                callbacks=[_Sync()], steps_ahead=1)
    args.update(overrides)
    return off_policy_fits(**args)


def test_off_policy_needs_a_server_correction_and_the_look_ahead():
    assert _problem() is None
    assert _problem(max_staleness=0, backend="hf", correction_on=False, processes=4, steps_ahead=0) is None
    assert "backend: vllm_server (got 'hf'" in _problem(backend="hf")
    assert "backend: vllm_server (got 'vllm'" in _problem(backend="vllm")
    assert "model.rollout_correction on" in _problem(correction_on=False)
    assert _problem(processes=2) is None  # the producer's collectives have a group of their own
    assert "no reward scored by a model in the trainer (judge:x) with 2 processes" in _problem(
        processes=2, model_rewards=("judge:x",))
    assert _problem(model_rewards=("judge:x",)) is None  # one process: its forward beside the update
    assert "dynamic_sampling off" in _problem(dynamic_sampling=True)
    assert "every_n_steps: 1 (got 2" in _problem(callbacks=[_Sync(every_n_steps=2)])
    assert "data.steps_ahead=0 but model.rollout.max_staleness=1" in _problem(steps_ahead=0)
    assert "data.steps_ahead=1 but model.rollout.max_staleness=0" in _problem(max_staleness=0, steps_ahead=1)
    several = _problem(backend="hf", correction_on=False)  # every unmet need at once
    assert "backend" in several and "rollout_correction" in several


def test_off_policy_on_a_cpu_warns_unless_openmp_threads_sleep():
    """OpenMP threads that spin when idle cost the overlap its time on shared cores (measured:
    docs/benchmarks.md); the variable is read once per process, so the run can only say so."""
    warning = off_policy_spin_warning(1, True, {"PATH": "/bin"})
    assert "OMP_WAIT_POLICY=unset" in warning and "start both with OMP_WAIT_POLICY=PASSIVE" in warning
    assert "OMP_WAIT_POLICY=ACTIVE" in off_policy_spin_warning(1, True, {"OMP_WAIT_POLICY": "ACTIVE"})
    assert off_policy_spin_warning(1, True, {"OMP_WAIT_POLICY": "passive"}) is None
    assert off_policy_spin_warning(0, True, {}) is None  # synchronous: the phases take turns
    assert off_policy_spin_warning(1, False, {}) is None  # a GPU trainer: its cores are not the engine's


def test_the_command_line_refuses_off_policy_with_the_hf_engine(tmp_path, monkeypatch):
    from ibpo_lit.__main__ import main
    from ibpo_lit.errors import ConfigError

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    with pytest.raises((ConfigError, SystemExit)) as err:
        main(["fit", "--config", os.path.join(os.path.dirname(TINY_VLLM), "tiny.yaml"), "--trainer.max_steps", "1",
              "--trainer.default_root_dir", str(tmp_path), "--model.rollout.max_staleness", "1"])
    assert "max_staleness=1 (one step off-policy) needs model.rollout.backend: vllm_server" in str(err.value)


# ---------------------------------------------------------------------------------- staleness
def test_staleness_counts_updates_and_is_asserted():
    assert staleness(trainer_version=5, sampled_version=4, num_mini_batches=1) == 1
    assert staleness(trainer_version=6, sampled_version=4, num_mini_batches=2) == 1  # one update, 2 optimizer steps
    assert staleness(trainer_version=4, sampled_version=4, num_mini_batches=1) == 0  # (a skipped step: no new weights)
    check_staleness(1.0, max_staleness=1, step=3)
    with pytest.raises(StalenessError, match="rollout step 3's batch was sampled 2 updates behind"):
        check_staleness(2.0, max_staleness=1, step=3)
    with pytest.raises(StalenessError):
        check_staleness(0.5, max_staleness=0, step=0)
    check_ranks_agree([1.0, 1.0], step=3)
    with pytest.raises(StalenessError, match=r"lag by 1, 0 updates on ranks 0..1"):
        check_ranks_agree([1.0, 0.0], step=3)


def test_the_producer_thread_hands_back_its_result_or_its_error():
    main_thread_mark = []
    ahead = AheadOfUpdate(lambda: time.sleep(0.2) or "batch")
    main_thread_mark.append(time.perf_counter())  # the caller runs on while the thread works
    assert ahead.join() == "batch"
    assert main_thread_mark[0] - ahead.started < 0.1

    def fail():
        raise ValueError("the server went away")

    failing = AheadOfUpdate(fail)
    failing.wait()  # waits without raising (the step is failing for its own reason)
    with pytest.raises(ValueError, match="the server went away"):
        failing.join()


# ----------------------------------------------------------------------- the batch in flight
def _produced() -> Produced:
    g = torch.Generator().manual_seed(0)
    rows, lp, lr = 4, 3, 5
    batch = RolloutBatch(
        prompt_ids=torch.randint(0, 50, (rows, lp), generator=g), prompt_mask=torch.ones(rows, lp, dtype=torch.bool),
        response_ids=torch.randint(0, 50, (rows, lr), generator=g),
        response_mask=torch.rand(rows, lr, generator=g) > 0.3,
        rollout_logp=-torch.rand(rows, lr, generator=g), group_index=torch.tensor([0, 0, 1, 1]),
        seeds=torch.tensor([11, 12, 13, 14]), finished=torch.tensor([True, False, True, True]))
    prompts = [Prompt([1, 2, 3], "1+1?", "2", uid="arithmetic:7", meta={"stream_position": {"epoch": 0, "index": 8}},
                      columns={"answer": "2"}),
               Prompt([4, 5, 6], "2+2?", "4", uid="arithmetic:8", meta={"stream_position": {"epoch": 0, "index": 9}})]
    corrections = Corrections(
        rewards=torch.tensor([math.nan, 1.0, math.nan, 0.0]), rewrite=torch.tensor([False, False, False, True]),
        kept_mask=torch.rand(rows, lr, generator=g) > 0.5, distance=torch.tensor([math.nan, 0.2, math.nan, 0.9]),
        alpha=0.6, train_batch=RolloutBatch(**{k: v[:2] for k, v in vars(batch).items()}),
        train_rewards=torch.tensor([1.0, 0.0]), train_source=torch.tensor([1, 3]), generated_tokens=7,
        prompt_tokens=30, metrics={"train/corrections": 2.0})
    scored = ScoredRollouts(prompts=prompts, rollouts=batch, texts=["a", "b", "c", "d"],
                            rewards=torch.tensor([1.0, 0.0, math.nan, 0.0]), step=5, corrections=corrections,
                            weights_version=4)
    return Produced(scored, {"reward/math": 0.5}, {}, ["math", "timed out"], {"generate": 1.5, "correct": 0.5},
                    10.0, 12.0)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.nan_to_num(-7), b.nan_to_num(-7))
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_the_batch_in_flight_round_trips_through_a_weights_only_checkpoint():
    produced = _produced()
    buffer = io.BytesIO()
    torch.save({"ibpo_lit": {"in_flight": in_flight_state(produced)}}, buffer)
    buffer.seek(0)
    back = in_flight_from_state(torch.load(buffer, weights_only=True)["ibpo_lit"]["in_flight"])
    assert _same(produced, back)
    assert isinstance(back.scored.corrections.train_batch, RolloutBatch)
    assert back.scored.prompts[0].columns == {"answer": "2"}
    # the comparison can fail: a changed token is seen
    back.scored.rollouts.response_ids[0, 0] += 1
    assert not _same(produced, back)


# -------------------------------------------------------------------------- the look-ahead
def _datamodule(**kwargs):
    from ibpo_lit.data.datamodule import PromptDataModule
    from ibpo_lit.models import build_tiny_tokenizer

    dm = PromptDataModule(prompts_per_step=2, steps_ahead=1, **kwargs)
    dm.tokenizer_obj = build_tiny_tokenizer()
    dm.setup("fit")
    return dm


def test_steps_with_lookahead_pairs_each_step_with_the_next():
    steps = list(steps_with_lookahead(iter(range(7)), 2))
    assert steps == [StepPrompts([0, 1], [2, 3]), StepPrompts([2, 3], [4, 5])]  # (6: no next step yet)


def test_the_data_module_hands_the_next_steps_prompts_and_resumes_after_this_steps():
    dm = _datamodule()
    it = iter(dm.train_dataloader())
    first, second = next(it), next(it)
    uids = lambda prompts: [p.uid for p in prompts]  # noqa: E731
    assert isinstance(first, StepPrompts)
    assert uids(first.now) == ["arithmetic:0", "arithmetic:1"] and uids(first.ahead) == ["arithmetic:2", "arithmetic:3"]
    assert uids(second.now) == uids(first.ahead)
    assert dm.on_before_batch_transfer(first, 0) is first  # handed on whole
    assert dm.position.index == 2  # only `now` is consumed: a resume starts at the step in flight
    state = dm.state_dict()
    resumed = _datamodule()
    resumed.load_state_dict(state)
    again = next(iter(resumed.train_dataloader()))
    assert uids(again.now) == uids(second.now) and uids(again.ahead) == uids(second.ahead)
    with pytest.raises(ValueError, match="data.steps_ahead"):
        _datamodule(num_workers=1)


# ----------------------------------------------------------------------- with a real server
@pytest.fixture(scope="module")
def server(session_server):
    """The url of the session's server (tests/rollout/conftest.py), shared with test_vllm_server.py."""
    return session_server.get()[1]


class _Record(L.Callback):
    """What each step trained on (its rollout step, weights version, texts) and logged."""

    def __init__(self):
        self.trained, self.logged, self.logp = [], [], []

    def on_before_update(self, trainer, pl_module, step):
        self.trained.append((step.step, step.weights_version, pl_module.weights_version, list(step.texts)))
        self.logp.append(step.rollouts.rollout_logp.clone())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.logged.append({k: float(v) for k, v in trainer.callback_metrics.items()
                            if k.startswith(("time/", "rollout/staleness", "timing/"))})


def _args(url, root, steps) -> list[str]:
    return ["--config", TINY_VLLM, "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root),
            "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
            "--model.rollout.backend", "vllm_server", "--model.rollout.vllm.server.url", url,
            "--model.rollout.max_staleness", "1",
            # one request at a time: the server's log-probs of a request vary at ~5e-7 with the
            # requests it batches it with (measured: 4.8e-7 on one batch of two otherwise equal
            # runs, 4e-6 in the weights after Adam), which would hide a resume's exactness
            "--model.rollout.vllm.server.max_concurrent_requests", "1"]


def _fit(url, root, steps, ckpt=None):
    from ibpo_lit.__main__ import main

    cli = main(_args(url, root, steps), run=False)
    record = _Record()
    cli.trainer.callbacks.append(record)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt)
    return cli, record


def _global_step(ckpt):
    try:  # (written atomically: a file that exists is whole)
        return torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"]
    except (FileNotFoundError, RuntimeError, EOFError):
        return None


def _sigkilled_after(url, root, steps, kill_at):
    """A fit of ``steps`` in a process of its own, SIGKILLed (its whole process group, no teardown)
    once its ``last.ckpt`` holds step ``kill_at``: mid-step, its thread generating ahead."""
    repo = os.path.join(os.path.dirname(__file__), "..", "..")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    root.mkdir(parents=True)
    ckpt = root / "checkpoints" / "last.ckpt"
    with open(root / "fit.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ibpo_lit", "fit", *_args(url, root, steps)], cwd=repo,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 900
            while (_global_step(ckpt) or 0) < kill_at:
                assert proc.poll() is None, (root / "fit.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no checkpoint of the step to kill after"
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGKILL)
            assert proc.wait() == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return ckpt


def _in_flight(ckpt):
    return in_flight_from_state(torch.load(ckpt, weights_only=True)["ibpo_lit"]["in_flight_per_rank"][0])


@pytest.mark.slow
def test_one_step_off_policy_overlaps_lags_one_update_and_resumes_exactly(server, tmp_path, monkeypatch,
                                                                           one_intra_op_thread):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with pytest.warns(UserWarning, match="max_staleness=1 on a CPU with OMP_WAIT_POLICY=unset"):  # the fit says so
        full, seen = _fit(server, tmp_path / "full", 2)
    print("off-policy step metrics (2-step fit):", seen.logged)  # (shown with -s)
    # step 0 samples now (version 0); the next step trains the batch sampled one update earlier
    assert [(s, sampled, trainer) for s, sampled, trainer, _ in seen.trained] == [(0, 0, 0), (1, 0, 1)]
    assert [m["rollout/staleness"] for m in seen.logged] == [0.0, 1.0]
    for m in seen.logged:  # the next step's generation starts before this step's update ends
        assert m["time/ahead_start"] < m["time/update_end"], m
        assert m["time/update_start"] < m["time/update_end"] and m["time/ahead_start"] < m["time/ahead_end"]
    # the checkpoint holds the next step's finished batch, sampled with this step's weights
    ahead = _in_flight(tmp_path / "full" / "checkpoints" / "last.ckpt")
    assert (ahead.scored.step, ahead.scored.weights_version) == (2, 1)
    assert ahead.scored.corrections is not None and len(ahead.scored.texts) == len(ahead.scored.rewards)

    ckpt = _sigkilled_after(server, tmp_path / "killed", 2, kill_at=1)
    saved = _in_flight(ckpt)
    assert _global_step(ckpt) == 1 and (saved.scored.step, saved.scored.weights_version) == (1, 0)
    resumed, resumed_seen = _fit(server, tmp_path / "killed", 2, ckpt=str(ckpt))
    # the resumed step trains the checkpoint's batch (not one sampled again with version 1's
    # weights: lag 0, other texts), the same as the full run's
    assert resumed_seen.trained[0][:3] == (1, 0, 1)
    assert resumed_seen.trained[0][3] == saved.scored.texts == seen.trained[1][3]
    assert torch.equal(resumed_seen.logp[0], saved.scored.rollouts.rollout_logp)  # the resume: bitwise
    # Against the uninterrupted run, the same tokens, but the server's sampled log-probs depend on
    # what it batched each request with (CI, 2026-11-27: equal texts, log-probs off in the last
    # float bits), which is the server's determinism, not the resume's: to rounding.
    torch.testing.assert_close(resumed_seen.logp[0], seen.logp[1], rtol=0, atol=1e-5)
    # and ends where the uninterrupted run does: the weights (to Adam-amplified rounding of those
    # log-probs; a resume that lost its place samples other texts and fails above), and the batch
    # it generated ahead
    full_weights, resumed_weights = full.model.policy.state_dict(), resumed.model.policy.state_dict()
    for k in full_weights:
        torch.testing.assert_close(resumed_weights[k], full_weights[k], rtol=0, atol=1e-4)
    last = _in_flight(ckpt)
    assert (last.scored.step, last.scored.weights_version) == (2, 1)  # sampled with the resumed update's weights
    if all(torch.equal(full_weights[k], resumed_weights[k]) for k in full_weights):  # same weights, same seeds
        assert torch.equal(last.scored.rollouts.response_ids, ahead.scored.rollouts.response_ids)
    else:
        assert last.scored.rollouts.response_ids.shape[0] == ahead.scored.rollouts.response_ids.shape[0]


# ------------------------------------------------------------ on 2 processes, with a real server
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scale"))


def _two_process_args(url, root, max_staleness, steps) -> tuple[str, ...]:
    """``python -m ibpo_lit fit``'s arguments on 2 CPU processes (FSDP2, gloo), sampling from
    ``url``, each rank's `staleness_probe.StalenessProbe` record in ``root/ranks``."""
    from fit_runs import CORRECTIONS, callbacks

    probe = {"class_path": "staleness_probe.StalenessProbe", "init_args": {"out_dir": str(root / "ranks")}}
    sync = {"class_path": "callbacks.VLLMWeightSync", "init_args": {"probe_tokens": 16, "probe_tolerance": 0.01}}
    return ("--trainer.max_steps", str(steps), "--trainer.devices", "2",
            "--trainer.strategy", '{"class_path": "ibpo_lit.scale.FSDP2Strategy"}', "--trainer.logger", "false",
            "--trainer.callbacks", callbacks(CORRECTIONS, sync, probe),
            "--model.rollout.backend", "vllm_server", "--model.rollout.vllm.server.url", url,
            "--model.rollout.max_staleness", str(max_staleness))


def _two_process_fit(url, root, max_staleness, steps):
    """The run of `_two_process_args`, to its end; each rank's record."""
    from fit_runs import read_ranks, run_fit

    run_fit("tiny_vllm.yaml", root, *_two_process_args(url, root, max_staleness, steps))
    return read_ranks(root / "ranks", 2)


@pytest.fixture(scope="module")
def two_process_ahead(server, tmp_path_factory):
    """A 3-step off-policy fit on 2 processes, unbroken (shared: two tests read it); its root."""
    root = tmp_path_factory.mktemp("two_process") / "ahead"
    _two_process_fit(server, root, 1, 3)
    return root


@pytest.mark.slow
def test_two_processes_generate_ahead_over_a_group_of_their_own(server, two_process_ahead, tmp_path):
    """2 processes (FSDP2): the producer threads' collectives (the server's waits and deadlines)
    run over a gloo group of their own beside the update's (`off_policy.producer_sync`; with the
    default group instead, they interleave with FSDP2's: the run hangs, killed after 240 s,
    2026-11-27, where it otherwise ends in about 70 s). Every step
    trains on both ranks with one agreed lag (0 at the first step, then 1), the next step's
    generation overlaps the update on every rank (``time/overlap_s``, the least over the ranks, > 0),
    every metric is declared, and the checkpoint (FSDP2's folder; its ``meta.pt``) holds each rank's
    own batch in flight. The same
    2 processes with ``max_staleness: 0`` sample step 0 alike and train on-policy, nothing ahead."""
    from ibpo_lit.training.metric_reductions import undeclared

    from fit_runs import read_ranks

    ranks = read_ranks(two_process_ahead / "ranks", 2)
    for rank in ranks:
        assert [(t["step"], t["sampled"], t["trainer"]) for t in rank["trained"]] == [(0, 0, 0), (1, 0, 1), (2, 1, 2)]
        assert [m["rollout/staleness"] for m in rank["logged"]] == [0.0, 1.0, 1.0]
        for m in rank["logged"]:  # the next step's generation starts before the update ends, on every rank
            assert m["time/overlap_s"] > 0 and m["time/ahead_start"] < m["time/update_end"], m
        assert undeclared(rank["logged"][-1]) == []
        assert rank["in_flight"]["step"] == 3 and rank["in_flight"]["sampled"] == 2
    assert ranks[0]["logged"] == ranks[1]["logged"]  # reduced over the ranks: one value each
    assert set(ranks[0]["trained"][0]["uids"]).isdisjoint(ranks[1]["trained"][0]["uids"])  # each rank its prompts
    saved = torch.load(two_process_ahead / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=True)["ibpo_lit"]
    per_rank = [in_flight_from_state(state) for state in saved["in_flight_per_rank"]]
    assert [[p.uid for p in b.scored.prompts] for b in per_rank] == [r["in_flight"]["uids"] for r in ranks]

    on_policy = _two_process_fit(server, tmp_path / "on_policy", 0, 2)
    for rank, ahead in zip(on_policy, ranks):
        assert [(t["step"], t["sampled"]) for t in rank["trained"]] == [(0, None), (1, None)]
        assert rank["trained"][0]["texts"] == ahead["trained"][0]["texts"]  # version 0's weights, the same seeds
        assert rank["in_flight"] is None and not any(k.startswith("time/") for k in rank["logged"][-1])
    assert "in_flight_per_rank" not in torch.load(tmp_path / "on_policy" / "checkpoints" / "last.ckpt" / "meta.pt",
                                                  weights_only=True)["ibpo_lit"]


def _sharded_step(last) -> int:
    """The step a sharded checkpoint (FSDP2's ``last.ckpt`` folder) holds; 0 before the first
    (published by one atomic rename: a ``meta.pt`` that exists is whole)."""
    try:
        return int(torch.load(last / "meta.pt", map_location="cpu", weights_only=True)["global_step"])
    except (OSError, RuntimeError, EOFError, KeyError):
        return 0


@pytest.mark.slow
def test_two_processes_sigkilled_mid_step_resume_the_batches_in_flight_exactly(server, two_process_ahead, tmp_path):
    """2 processes (FSDP2) SIGKILLed (the whole process group, no teardown) once the checkpoint
    holds step 1, while each rank's thread generates step 2's batch, then resumed with
    ``--ckpt_path last`` to 3 steps: every rank trains exactly the batches the unbroken run
    trained (rollout step, the weights version sampled with, prompt uids, texts), the first of
    them its own batch from the checkpoint bitwise, never more than 1 update stale, and ends
    with the unbroken run's weights and batch in flight. With the saved batches not read back
    (``IBPOModule.on_load_checkpoint``'s ``keep`` forced False) step 1 samples again with
    version 1's weights: lag 0, other texts, and this test fails (checked 2026-11-27)."""
    from fit_runs import read_ranks, run_fit, start_fit

    steps, kill_at = 3, 1
    killed = tmp_path / "killed"
    args = _two_process_args(server, killed, 1, steps)
    proc = start_fit("tiny_vllm.yaml", killed, *args)
    last = killed / "checkpoints" / "last.ckpt"
    try:
        deadline = time.monotonic() + 300
        while _sharded_step(last) < kill_at:
            assert proc.poll() is None, (killed / "fit.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint of step 1 within 300 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # every rank at once, mid-step: no teardown, no final save
        assert proc.wait() == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    killed_at = _sharded_step(last)
    assert kill_at <= killed_at < steps, killed_at
    assert not (killed / "ranks").exists()  # it died before its end
    saved = torch.load(last / "meta.pt", weights_only=True)["ibpo_lit"]["in_flight_per_rank"]
    saved = [in_flight_from_state(state) for state in saved]

    run_fit("tiny_vllm.yaml", killed, *args, "--ckpt_path", "last")

    unbroken, resumed = read_ranks(two_process_ahead / "ranks", 2), read_ranks(killed / "ranks", 2)
    fields = ("step", "sampled", "trainer", "uids", "texts")
    for rank, (a, b, ahead) in enumerate(zip(unbroken, resumed, saved)):
        # the checkpoint holds this rank's own batch of the step in flight, sampled one update back
        assert (ahead.scored.step, ahead.scored.weights_version) == (killed_at, killed_at - 1), rank
        assert [p.uid for p in ahead.scored.prompts] == a["trained"][killed_at]["uids"], rank
        # the resumed run trains exactly the unbroken run's batches from there
        assert [{k: t[k] for k in fields} for t in b["trained"]] == \
            [{k: t[k] for k in fields} for t in a["trained"][killed_at:]], rank
        assert b["trained"][0]["texts"] == ahead.scored.texts, rank
        # the first from the checkpoint, bitwise
        assert torch.equal(torch.tensor(b["trained"][0]["logp"]), ahead.scored.rollouts.rollout_logp), rank
        for x, y in zip(b["trained"], a["trained"][killed_at:]):
            # against the unbroken run: the server's log-probs of a request depend on what it
            # batches it with (both ranks' requests at once here), to rounding (as on one process)
            torch.testing.assert_close(torch.tensor(x["logp"]), torch.tensor(y["logp"]), rtol=0, atol=1e-5)
        assert [m["rollout/staleness"] for m in b["logged"]] == [1.0] * (steps - killed_at), rank
        assert b["in_flight"] == a["in_flight"], rank  # the batch generated ahead at the end: step 3's
    assert resumed[0]["trained"][0]["uids"] != resumed[1]["trained"][0]["uids"]  # each rank its own batch
    # the weights where the unbroken run's are: to the Adam-amplified rounding of those log-probs
    # (bitwise only if the server batched alike; a resume that lost its place fails above)
    wa, wb = torch.load(two_process_ahead / "ranks" / "weights.pt"), torch.load(killed / "ranks" / "weights.pt")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-4)
