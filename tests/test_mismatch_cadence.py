"""``rollout.mismatch_every_n_steps``: ``rollout/logprob_mismatch`` is measured on every N-th
step only, and a step that does not measure it runs no extra forward for it (issue 42, review
item 6: a process with no trainable row paid a no-grad forward of a micro-batch every step just
for the metric, ~7 s at 32k tokens)."""
from __future__ import annotations

import math

import pytest
import torch

from ibpo_lit.config import AlgorithmConfig, IBPOConfig, OptimConfig, RolloutConfig
from ibpo_lit.models import build_tiny_model
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.optimizer import build_optimizer
from ibpo_lit.training.step_types import StepStats, UpdateBatch
from ibpo_lit.training.update import PolicyUpdate, UpdateRuntime


def _idle_batch() -> UpdateBatch:
    """Four rows, every advantage 0: nothing to train, so only the metric would forward them."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 90, (4,), generator=g).tolist() for _ in range(4)]
    responses = [torch.randint(3, 90, (6,), generator=g).tolist() for _ in range(4)]
    batch = RolloutBatch.from_lists(prompts, responses, [[-1.0] * 6] * 4, [True] * 4, list(range(4)), [0, 0, 1, 1],
                                    pad_token_id=0)
    return UpdateBatch(batch=batch, advantages=torch.zeros(4), token_weights=None)


def _steps(every: int, steps: int = 4) -> tuple[list[float], list[int]]:
    """The metric of each step, and the policy's forwards in each."""
    model = build_tiny_model(seed=0)
    updater = PolicyUpdate(AlgorithmConfig(ibpo=IBPOConfig(variant="none")), RolloutConfig(mismatch_every_n_steps=every),
                           OptimConfig(), max_nonfinite_steps=5, logprob_chunk_tokens=None)
    updater.bind(model, None, UpdateRuntime(step_stats=StepStats()))
    built = build_optimizer(model, OptimConfig(), max_steps=10)
    optimizer, scheduler = built["optimizer"], built["lr_scheduler"]["scheduler"]
    forwards = []
    handle = model.register_forward_hook(lambda *_: forwards.append(1))
    metrics, counts = [], []
    for step in range(steps):
        before = len(forwards)
        metrics.append(updater.run(_idle_batch(), optimizer, scheduler, step)["rollout/logprob_mismatch"])
        counts.append(len(forwards) - before)
    handle.remove()
    return metrics, counts


def test_every_step_by_default():
    metrics, forwards = _steps(every=1)
    assert all(math.isfinite(m) for m in metrics)
    assert forwards[0] > 0 and forwards == forwards[:1] * 4  # (the shared-prompt path: prompt, then rows)


def test_every_nth_step_and_no_forward_between():
    metrics, forwards = _steps(every=2)
    assert [math.isfinite(m) for m in metrics] == [True, False, True, False]
    k = _steps(every=1)[1][0]
    assert forwards == [k, 0, k, 0]


def test_off_measures_nothing_and_forwards_nothing():
    metrics, forwards = _steps(every=0)
    assert all(math.isnan(m) for m in metrics) and forwards == [0, 0, 0, 0]


def test_a_negative_cadence_is_refused():
    with pytest.raises(ValueError, match="mismatch_every_n_steps must be >= 0"):
        RolloutConfig(mismatch_every_n_steps=-1)
