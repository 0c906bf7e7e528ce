"""``seed_everything`` decides every random stream unless the stream's own seed is set (issue 43,
item 10; the rule is `ibpo_lit.seeds.stream_seed`).

What is checked:
- The rule: a stream's own seed wins; unset, ``seed_everything``'s (``PL_GLOBAL_SEED``); neither,
  0. The module, the data module and the command line resolve it when they are built.
- Seed 0 is today's runs: the resolved seeds are the ones every run used before the knob
  decided anything (rollout 0, data order 0, arithmetic 0), through formulas unchanged for seed 0.
- Data order follows ``seed_everything``; the held-out problems do not (an evaluation set).
- Two tiny fits (configs/tiny.yaml, fp32, ``model.rollout.seed`` unset) differing only in
  ``seed_everything`` sample other prompts and other rollouts with other rewards; a fit that never
  calls ``seed_everything`` samples what ``seed_everything: 0`` does, bit for bit.
- A resumed ``fit`` keeps its checkpoint's seed: resumed with ``--seed_everything 0`` a run begun
  with 1 ends where the unbroken run of 1 ends (seeds, RNG states, data position exactly; weights
  to 1e-6, since in-process fits may round differently: tests/test_resume.py is the bitwise
  check, in fresh processes); a module or data module built with other seeds refuses the
  checkpoint.

Every test restores ``PL_GLOBAL_SEED`` (Lightning's ``seed_everything`` writes it into this
process's environment, where later tests would read it).
"""
from __future__ import annotations

import os
import random
import sys

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from ibpo_lit.config import RolloutConfig
from ibpo_lit.data.arithmetic import ArithmeticConfig, arithmetic_problem, held_out
from ibpo_lit.data.datamodule import PromptDataModule
from ibpo_lit.data.records import Record
from ibpo_lit.data.stream import RecordSource
from ibpo_lit.models.tiny import build_tiny_tokenizer
from ibpo_lit.module import IBPOModule
from ibpo_lit.seeds import DEFAULT_SEED, SEED_ENV, check_resumed_seeds, run_seed, stream_seed

TINY = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.yaml")
PARITY = """
import zlib

def parity(prompts, completions, **columns):
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]
"""


@pytest.fixture(autouse=True)
def no_run_seed(monkeypatch):
    """Start without a run seed (as a fresh process does) and leave the environment as found."""
    monkeypatch.delenv(SEED_ENV, raising=False)
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)


def _data(**kwargs) -> PromptDataModule:
    dm = PromptDataModule(prompts_per_step=4, val_size=3, **kwargs)
    dm.tokenizer_obj = build_tiny_tokenizer()
    dm.setup("fit")
    return dm


def _first_problems(dm: PromptDataModule) -> list[str]:
    return [p.problem for p in next(iter(dm.train_dataloader()))]


# ------------------------------------------------------------------------------ the rule
def test_a_streams_own_seed_wins_else_seed_everythings_else_0(monkeypatch):
    assert DEFAULT_SEED == 0
    assert (run_seed(), stream_seed(None), stream_seed(5)) == (0, 0, 5)
    monkeypatch.setenv(SEED_ENV, "3")  # what Lightning's seed_everything(3) leaves
    assert (run_seed(), stream_seed(None), stream_seed(5), stream_seed(0)) == (3, 3, 5, 0)
    assert stream_seed(None, run=7) == 7
    monkeypatch.setenv(SEED_ENV, "x")
    with pytest.raises(ValueError, match="PL_GLOBAL_SEED='x' is not an integer seed"):
        run_seed()


def test_the_module_and_the_data_module_take_the_run_seed_when_built(monkeypatch):
    # Nothing called seed_everything (a script, the Python API): every stream has seed 0, the
    # seeds of every run before the knob (rollout.seed's old default 0, data.seed 0, arithmetic 0).
    assert IBPOModule().seeds == {"seed_everything": 0, "model.rollout.seed": 0}
    assert PromptDataModule().seeds == {"data.seed": 0, "data.arithmetic.seed": 0}

    monkeypatch.setenv(SEED_ENV, "3")
    module = IBPOModule()
    assert module.seeds == {"seed_everything": 3, "model.rollout.seed": 3}
    assert module.rollout_cfg.seed == module.updater.rollout_cfg.seed == 3  # the mini-batch order's too
    assert PromptDataModule().seeds == {"data.seed": 3, "data.arithmetic.seed": 3}
    # A stream's own seed wins, whatever seed_everything says.
    assert IBPOModule(rollout=RolloutConfig(seed=5)).seeds == {"seed_everything": 3, "model.rollout.seed": 5}
    assert PromptDataModule(seed=0, arithmetic=ArithmeticConfig(seed=1)).seeds == {
        "data.seed": 0, "data.arithmetic.seed": 1}
    # Decided when built: a seed set afterwards does not move it mid-run.
    monkeypatch.setenv(SEED_ENV, "4")
    assert module.rollout_cfg.seed == 3


def test_seed_0_orders_the_data_as_before():
    # Arithmetic: an unset seed is the stream of seed 0; a file's epochs: seed 0 shuffles epoch e
    # with random.Random(e), the order every run had before (then `seed + e`).
    assert [arithmetic_problem(i, ArithmeticConfig()) for i in range(20)] == \
        [arithmetic_problem(i, ArithmeticConfig(seed=0)) for i in range(20)]
    records = [Record(f"q{i}", str(i), f"u{i}") for i in range(10)]
    for epoch in range(4):
        before = list(range(10))
        random.Random(0 + epoch).shuffle(before)
        assert RecordSource(records, seed=0).order(epoch) == before
    # Seed 1 is not seed 0 shifted by an epoch (`seed + e` made seed 1's epoch 0 seed 0's epoch 1).
    assert RecordSource(records, seed=1).order(0) != RecordSource(records, seed=0).order(1)


def test_data_order_follows_seed_everything_and_the_held_out_problems_do_not(monkeypatch):
    zero = _data()
    monkeypatch.setenv(SEED_ENV, "1")
    one = _data()
    assert _first_problems(one) != _first_problems(zero)
    # the held-out set is an evaluation set: the same problems whatever seed_everything is
    assert [p.problem for p in one.val_prompts()] == [p.problem for p in zero.val_prompts()]
    assert held_out(ArithmeticConfig()) == held_out(ArithmeticConfig(seed=0))
    # an explicit arithmetic.seed pins the order
    assert _first_problems(_data(arithmetic=ArithmeticConfig(seed=0))) == _first_problems(zero)


def test_the_command_line_hands_seed_everything_to_every_stream(monkeypatch):
    from ibpo_lit.__main__ import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])

    def built(*extra):
        cli = main(["--config", TINY, "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
                    *extra], run=False)
        return cli.model.seeds, cli.datamodule.seeds, cli.config["seed_everything"]

    # configs/tiny.yaml pins model.rollout.seed: 1 (sampling and the tiny model's weights);
    # seed_everything decides the data order there.
    assert built("--seed_everything", "2") == (
        {"seed_everything": 2, "model.rollout.seed": 1}, {"data.seed": 2, "data.arithmetic.seed": 2}, 2)
    # Unset, the rollout seed is seed_everything's too.
    assert built("--seed_everything", "2", "--model.rollout.seed", "null")[0] == {
        "seed_everything": 2, "model.rollout.seed": 2}
    # `true` is Lightning's pick (2.6: PL_GLOBAL_SEED, else 0), recorded in the config.
    monkeypatch.delenv(SEED_ENV, raising=False)
    assert built("--seed_everything", "true", "--model.rollout.seed", "null") == (
        {"seed_everything": 0, "model.rollout.seed": 0}, {"data.seed": 0, "data.arithmetic.seed": 0}, 0)


def test_a_checkpoint_of_other_seeds_is_refused_when_resuming(monkeypatch):
    monkeypatch.setenv(SEED_ENV, "1")
    module, dm = IBPOModule(), PromptDataModule()
    checkpoint = {"state_dict": {}}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["ibpo_lit"]["seeds"] == {"seed_everything": 1, "model.rollout.seed": 1}
    state = dm.state_dict()
    assert state["seeds"] == {"data.seed": 1, "data.arithmetic.seed": 1}

    IBPOModule().on_load_checkpoint(checkpoint)  # the same seeds: resumes
    PromptDataModule().load_state_dict(state)
    monkeypatch.setenv(SEED_ENV, "0")
    with pytest.raises(ValueError, match=r"policy ran with seeds seed_everything 1 \(now 0\), "
                                         r"model.rollout.seed 1 \(now 0\)"):
        IBPOModule().on_load_checkpoint(checkpoint)
    with pytest.raises(ValueError, match=r"training data ran with seeds data.seed 1 \(now 0\)"):
        PromptDataModule().load_state_dict(state)
    IBPOModule().on_load_checkpoint({"ibpo_lit": {"rollout_step": 2}})  # from before seeds were recorded
    check_resumed_seeds(None, {"data.seed": 0}, "training data")


# ------------------------------------------------------------------------------ fits
class _Draws(Callback):
    """What each step sampled: its problems, rollout rows, row seeds and rewards."""

    def __init__(self):
        super().__init__()
        self.steps: list[tuple] = []

    def on_rollouts_scored(self, trainer, pl_module, step):
        r = step.rollouts
        self.steps.append(([p.problem for p in step.prompts], r.response_ids.clone(), r.seeds.clone(),
                           step.rewards.clone()))


@pytest.fixture
def parity_reward(tmp_path, monkeypatch):
    """A reward that splits every group (the tiny random model almost never writes a right sum,
    so under math every reward is 0, the weights never move and any two runs would agree)."""
    folder = tmp_path / "reward"
    folder.mkdir()
    (folder / "parity_reward.py").write_text(PARITY)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


def _args(root, steps: int, *extra: str) -> list[str]:
    # model.rollout.seed unset (tiny.yaml pins it): seed_everything decides sampling and weights too.
    return ["--config", TINY, "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root),
            "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
            "--model.reward", "parity_reward:parity", "--model.rollout.seed", "null",
            "--model.rollout.sampling.max_new_tokens", "12", *extra]


class _StopAfter(Callback):
    """Ends a fit after ``steps`` steps (its checkpoint written), as a kill would: the schedule
    stays the one of ``trainer.max_steps``."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps

    def on_train_batch_end(self, trainer, *args):
        trainer.should_stop = trainer.global_step >= self.steps


def _fit(root, steps: int, *extra: str, stop_after: int | None = None) -> _Draws:
    from ibpo_lit.__main__ import main

    cli = main(_args(root, steps, *extra), run=False)
    draws = _Draws()
    cli.trainer.callbacks.append(draws)
    if stop_after is not None:
        cli.trainer.callbacks.append(_StopAfter(stop_after))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return draws


def _same(a: _Draws, b: _Draws) -> bool:
    return len(a.steps) == len(b.steps) and all(
        x[0] == y[0] and all(torch.equal(u, v) for u, v in zip(x[1:], y[1:])) for x, y in zip(a.steps, b.steps))


def _assert_same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _tensors(tree, where: str = ""):
    """(name, tensor) of every floating tensor in a nested dict/list, in order."""
    if isinstance(tree, torch.Tensor):
        if tree.is_floating_point():
            yield where, tree
    elif isinstance(tree, dict):
        for key in tree:
            yield from _tensors(tree[key], f"{where}.{key}")
    elif isinstance(tree, (list, tuple)):
        for i, item in enumerate(tree):
            yield from _tensors(item, f"{where}[{i}]")


def _assert_same_to_float_noise(a, b, where: str) -> None:
    """``b`` is ``a`` up to rounding noise: at most 0.1% of the elements beyond 1e-6 + 1e-4
    relative, and none beyond 1e-4 absolute. Rounding noise in a gradient is amplified by Adam
    where an element's second moment is tiny (CI saw one weight of 4096 off by 2.5e-6 after one
    step), so a plain 1e-6 bound fails now and then; a resume that lost its place would differ by
    about lr = 1e-3 in most elements."""
    pairs = list(zip(_tensors(a, where), _tensors(b, where)))
    assert pairs and all(na == nb for (na, _), (nb, _) in pairs), where
    off = total = 0
    for (name, x), (_, y) in pairs:
        assert x.shape == y.shape, name
        diff = (y.double() - x.double()).abs()
        assert not diff.numel() or float(diff.max()) <= 1e-4, f"{name}: {float(diff.max())}"
        off += int((diff > 1e-6 + 1e-4 * x.double().abs()).sum())
        total += diff.numel()
    assert off <= 1e-3 * total, f"{where}: {off} of {total} elements beyond float noise"


@pytest.mark.slow
@pytest.mark.usefixtures("one_intra_op_thread")
def test_seed_everything_changes_every_stream_and_a_resume_keeps_the_checkpoints(tmp_path, parity_reward,
                                                                                  monkeypatch):
    from ibpo_lit.__main__ import main

    zero = _fit(tmp_path / "zero", 2, "--seed_everything", "0")
    monkeypatch.delenv(SEED_ENV)
    unseeded = _fit(tmp_path / "unseeded", 2, "--seed_everything", "false")  # never calls seed_everything
    one = _fit(tmp_path / "one", 2, "--seed_everything", "1")

    # No seed_everything: the streams of seed 0, bit for bit (prompts, rollouts, seeds, rewards).
    assert _same(unseeded, zero)
    # seed_everything 1: other prompts, other rows sampled with other seeds, other rewards.
    assert [len(s[0]) for s in one.steps] == [2, 2]
    for (p0, ids0, seeds0, _), (p1, ids1, seeds1, _) in zip(zero.steps, one.steps):
        assert p0 != p1 and not torch.equal(ids0, ids1) and set(seeds0.tolist()).isdisjoint(seeds1.tolist())
    assert not torch.equal(torch.cat([s[3] for s in zero.steps]), torch.cat([s[3] for s in one.steps]))
    assert 0 < float(torch.cat([s[3] for s in one.steps]).mean()) < 1  # the groups had something to learn

    # Begun with seed 1 and resumed with --seed_everything 0: the run keeps its checkpoint's seed
    # and ends where the unbroken run of seed 1 ends (the same seeds, RNG states and data position).
    _fit(tmp_path / "split", 2, "--seed_everything", "1", stop_after=1)
    ckpt = tmp_path / "split" / "checkpoints" / "last.ckpt"
    first = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert first["global_step"] == 1
    step1 = first["state_dict"]
    main(["fit", *_args(tmp_path / "split", 2, "--seed_everything", "0"), "--ckpt_path", str(ckpt)])
    a = torch.load(tmp_path / "one" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    b = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert a["global_step"] == b["global_step"] == 2
    assert b["ibpo_lit"]["seeds"] == {"seed_everything": 1, "model.rollout.seed": 1}
    data_key = next(k for k in a if k.endswith("PromptDataModule"))
    for key in ("ibpo_lit", data_key):  # seeds, counters, every RNG, the data position: exactly
        _assert_same(a[key], b[key], key)
    # The weights and the optimizer state to float noise, not bitwise: these fits share one
    # process with other tests, where CPU kernels can round differently from run to run (memory
    # alignment); tests/test_resume.py checks bitwise resume in fresh processes. The resumed
    # step itself moved the weights by ~lr = 1e-3, far beyond the noise (_assert_same_to_float_noise).
    for key in ("state_dict", "optimizer_states"):
        _assert_same_to_float_noise(a[key], b[key], key)
    for i, (x, y) in enumerate(zip(a["optimizer_states"], b["optimizer_states"])):
        _assert_same(x["param_groups"], y["param_groups"], f"optimizer_states[{i}].param_groups")
    moved = max(float((b["state_dict"][k] - step1[k]).abs().max()) for k in step1)
    assert moved > 1e-4, moved
