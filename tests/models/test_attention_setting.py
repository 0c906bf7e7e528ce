"""``model.attn_implementation``: the attention kernel the trainer's models load with.

What a user sets to make ``rollout.packing: auto`` pack (flex attention, flash-attention) or to
run eager attention: it reaches the loaded policy and reference (one process and FSDP2's meta
build), the packing rule, and the plan; a name outside the known ones fails before any weights
load. Flex attention cannot train on the CPU (torch: no backward there) and flash-attention is
not installed here, so the CPU tests set ``eager`` and check the others only where no kernel runs.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from ibpo_lit.models.attention import ATTENTION_SETTINGS
from ibpo_lit.models.loading import load_policy
from ibpo_lit.training.packing import packs

REPO = Path(__file__).resolve().parents[2]


def test_a_name_outside_the_known_ones_fails_before_any_weights_load():
    from ibpo_lit.module import IBPOModule

    with pytest.raises(ValueError, match="model.attn_implementation must be one of sdpa, eager, flex_attention"):
        IBPOModule(model="tiny-llama", attn_implementation="flash")
    assert IBPOModule(model="tiny-llama", attn_implementation="eager").policy is None  # nothing loaded yet


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_the_loaded_model_runs_the_kernel_named_and_computes_the_same_logits(name):
    default, _ = load_policy(name, seed=3)
    eager, _ = load_policy(name, seed=3, attn_implementation="eager")
    assert default.config._attn_implementation == "sdpa" and eager.config._attn_implementation == "eager"
    ids = torch.randint(5, 60, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (eager(ids).logits - default(ids).logits).abs().max() < 1e-5  # same weights, another kernel
    # The kernel really changed: eager hands the softmax's weights back, SDPA does not.
    with torch.no_grad():
        assert eager(ids, output_attentions=True).attentions is not None


def test_packing_follows_the_setting():
    """`auto` packs where the kernel skips the other rows; under eager only `on` packs."""
    eager, _ = load_policy("tiny-llama", attn_implementation="eager")
    assert packs(eager, "on") and not packs(eager, "auto")
    flex, _ = load_policy("tiny-llama", attn_implementation="flex_attention")  # set, never run (no CPU backward)
    assert flex.config._attn_implementation == "flex_attention" and packs(flex, "auto")
    assert set(ATTENTION_SETTINGS) >= {"sdpa", "eager", "flex_attention", "flash_attention_2"}


def test_the_plan_counts_the_runs_attention():
    """Eager keeps a float mask and each layer's softmax output for a packed sequence: the plan
    charges more memory for it than for SDPA on the same run."""
    from ibpo_lit.plan.cli import plan_for_config

    args = ["--config", str(REPO / "configs" / "tiny.yaml"), "--model.rollout.packing", "on"]
    sdpa = plan_for_config(args)
    eager = plan_for_config([*args, "--model.attn_implementation", "eager"])
    assert sdpa.model.attention == "sdpa" and eager.model.attention == "eager"
    total = {p.name: p.total for p in sdpa.phases}
    assert any(p.total > total[p.name] for p in eager.phases)


def test_a_fit_with_eager_attention_and_packing_trains_on_eager(tmp_path):
    """What a user runs: `fit` with --model.attn_implementation eager (and packing on); the
    policy and the reference the run trains with both run eager attention."""
    from ibpo_lit.__main__ import main

    sys.argv = sys.argv[:1]
    cli = main(["fit", "--config", str(REPO / "configs" / "tiny.yaml"), "--trainer.max_steps", "1",
                "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
                "--trainer.logger", "false", "--model.attn_implementation", "eager", "--model.rollout.packing", "on",
                "--model.algorithm.beta_kl", "0.05"])
    assert cli.trainer.global_step == 1
    assert cli.model.policy.config._attn_implementation == "eager"
    assert cli.model.ref_policy.config._attn_implementation == "eager"
