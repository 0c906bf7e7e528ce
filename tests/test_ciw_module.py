"""CIW inside the module: the weights the loss receives are the scorer's (times IBPO-mask's),
on real steps of the tiny model whose responses are replaced by written-out solutions (a
random model never writes the answer marker)."""
import os
import sys

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from ibpo_lit.__main__ import main
from ibpo_lit.module import IBPOModule
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.training.ciw_scorer import CIWScorer
from ibpo_lit.training.update import PolicyUpdate

ROOT = os.path.join(os.path.dirname(__file__), "..")
SOLUTIONS = [
    "2 + 3 = 5. So we add the two numbers together. #### 5",
    "We need the sum here. 4 + 1 = 5. #### 5",
    "I think it is six. #### 6",
    "no idea at all",
]


class WrittenSolutions(Callback):
    """Before the corrections: each rollout's response becomes one of SOLUTIONS (+ EOS); rows
    with the right answer get reward 1, so groups have both signs of advantage."""

    def on_rollouts_scored(self, trainer, pl_module, step):
        tok = pl_module.tokenizer
        eos = tok.eos_token_id
        old = step.rollouts
        texts = [SOLUTIONS[i % len(SOLUTIONS)] for i in range(len(old))]
        responses = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
        step.rollouts = RolloutBatch.from_lists(
            prompts=old.prompt_lists(), responses=responses, logps=[[0.0] * len(r) for r in responses],
            finished=[True] * len(responses), seeds=old.seeds.tolist(), group_index=old.group_index.tolist(),
            pad_token_id=eos,
        )
        step.texts = texts
        step.rewards = torch.tensor([1.0 if t.endswith("#### 5") else 0.0 for t in texts])


@pytest.mark.parametrize("ibpo", ["none", "mask"])
def test_loss_gets_the_scorers_weights(tmp_path, monkeypatch, ibpo):
    seen = []
    original = PolicyUpdate.policy_loss

    def spy(self, batch, advantages, token_weights=None, *args, **kwargs):
        seen.append((batch, advantages, token_weights))
        return original(self, batch, advantages, token_weights, *args, **kwargs)

    monkeypatch.setattr(PolicyUpdate, "policy_loss", spy)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    cli = main(["--config", os.path.join(ROOT, "configs", "tiny_ciw.yaml"), "--trainer.max_steps", "1",
                "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
                "--model.algorithm.ibpo.variant", ibpo, "--model.rollout.micro_batch_size", "64"], run=False)
    cli.trainer.callbacks.insert(0, WrittenSolutions())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)

    metrics = cli.trainer.logged_metrics
    assert float(metrics["ciw/spans_per_rollout"]) > 0 and float(metrics["ciw/marker_frac"]) > 0
    (batch, advantages, weights), = [s for s in seen if s[2] is not None][:1]
    # an independent scorer on the same rows and policy version gives the same CIW weights
    # (the step's policy has since taken one optimizer step: compare against a fresh module
    # at the initial weights)
    fresh = IBPOModule(model="tiny-llama", algorithm=cli.model.algorithm, rollout=cli.model.rollout_cfg)
    fresh.configure_model()
    expected = CIWScorer(cli.model.algorithm.ciw, fresh.tokenizer)(fresh.policy, batch, rows=advantages != 0)
    ciw_w = expected.weights[:, : weights.shape[1]]
    active = advantages != 0
    if ibpo == "none":
        torch.testing.assert_close(weights[active], ciw_w[active])
    else:  # IBPO-mask weights are 0/1 per token: the product keeps CIW's values where kept
        product_ok = (weights[active] == 0) | torch.isclose(weights[active], ciw_w[active])
        assert bool(product_ok.all())
    assert (weights[active] != 1).any()  # CIW did reweight something
