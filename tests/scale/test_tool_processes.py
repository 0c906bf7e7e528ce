"""Tool-integrated rollouts in training, as users run them (``configs/tiny_tools.yaml``, the real
math reward, the real sandbox), on one process and on two (FSDP2): the same rollouts, tool turns
included, from the same seeds, and the same weights after the steps.

The model is tiny-llama taught to answer with a cell (tests/rollout/tool_policy.py): at
temperature 1 it writes cells, some wrong, some broken, and rows finish after different numbers
of turns, so the processes must agree each turn on whether to call the engine again."""
import pytest
import torch

from fit_runs import callbacks, read_ranks, recorder, run_fit, scalars

STEPS = 2
COMMON = ("--trainer.max_steps", str(STEPS), "--model.optim.eps", "1e-6", "--checkpoint.every_n_train_steps", "0")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, taught_tool_policy):
    taught = taught_tool_policy
    out = {}
    for name, extra, world in (
        ("one", ("--trainer.devices", "1", "--data.prompts_per_step", "4"), 1),
        ("fsdp2", ("--trainer.devices", "2", "--trainer.strategy", '{"class_path": "ibpo_lit.scale.FSDP2Strategy"}'), 2),
    ):
        root = tmp_path_factory.mktemp(name)
        run_fit("tiny_tools.yaml", root, *COMMON, "--model.model", str(taught), *extra,
                "--trainer.callbacks", callbacks({"class_path": "callbacks.CorrectionRollouts"}, recorder(root)))
        out[name] = (root, read_ranks(root, world), torch.load(root / "weights.pt"))
    return out


@pytest.mark.slow
def test_tool_rollouts_train_and_log_their_metrics(runs):
    root, (single,), _ = runs["one"]
    logged = scalars(root)
    calls = logged["rollout/tool_calls"]
    assert len(calls) == STEPS and max(calls.values()) > 0.5, calls  # the taught policy calls the tool
    assert all(v >= 0 for v in logged["rollout/tool_errors"].values())
    assert all(v > 0 for v in logged["timing/tool_s"].values())
    assert all(torch.isfinite(torch.tensor(v)) for v in logged["train/loss"].values())
    assert any(t > 0 for r in single["rollouts"] for t in r["tool_tokens"])
    assert "train/reward" in logged
    # IBPO's correction prompts show the transcripts as they were, tool turns included
    prompts = [p for r in single["rollouts"] for p in r["correction_prompts"]]
    assert prompts and any("```output\n" in p for p in prompts)


@pytest.mark.slow
def test_two_processes_roll_out_tools_like_one(runs):
    _, (single,), reference = runs["one"]
    _, ranks, weights = runs["fsdp2"]
    for step in range(STEPS):
        one, r0, r1 = single["rollouts"][step], ranks[0]["rollouts"][step], ranks[1]["rollouts"][step]
        assert one["seeds"] == r0["seeds"] + r1["seeds"], step
        assert one["responses"] == r0["responses"] + r1["responses"], step
        assert one["tool_tokens"] == r0["tool_tokens"] + r1["tool_tokens"], step
        assert one["rewards"] == r0["rewards"] + r1["rewards"], step
    # rows that ran different numbers of turns on the two ranks (the collective's hard case)
    assert len({t for r in single["rollouts"] for t in r["tool_tokens"]}) > 1
    diff = max(float((weights[k] - reference[k]).abs().max()) for k in reference)
    assert diff < 1e-5, diff
