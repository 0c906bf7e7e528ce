"""Tiny models made in code for the reward-model and judge tests, saved with ``save_pretrained``.

- `save_tiny_reward_model`: a 2-layer Llama sequence classifier (num_labels 1) over the tiny
  character tokenizer, with or without a chat template.
- `save_constant_judge`: a tiny causal LM whose greedy reply is always one character: every
  token embeds to the same vector and every attention/MLP output is zero, so the last hidden
  state is the same for any prompt, and the LM head's only non-zero row (that character's)
  points along it.
- `CorrectionsOnRankZeroOnly`: a callback (loaded by class path into 2-process fits) that, before
  the corrections run, marks every rollout of rank 1 correct (reward 1) and every other one of
  rank 0 wrong (reward 0: IBPO corrects a reward of exactly 0), so rank 1 has nothing to correct
  while rank 0 does: the corrections' scoring must still run on both ranks.
"""
from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from transformers import LlamaForCausalLM, LlamaForSequenceClassification

from ibpo_lit.models.tiny import CHARACTERS, SPECIAL_TOKENS, build_tiny_tokenizer, tiny_config


def save_tiny_reward_model(folder: Path, seed: int = 0, chat_template: bool = True, num_labels: int = 1) -> Path:
    config = tiny_config("llama")
    config.num_labels = num_labels
    config.architectures = ["LlamaForSequenceClassification"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
        model.score.weight.data.normal_(0.0, 1.0)  # scores of order 1, far apart between texts
    tokenizer = build_tiny_tokenizer()
    if not chat_template:
        tokenizer.chat_template = None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_constant_judge(folder: Path, reply: str = "1") -> Path:
    config = tiny_config("llama")
    config.tie_word_embeddings = False
    model = LlamaForCausalLM(config)
    token = len(SPECIAL_TOKENS) + CHARACTERS.index(reply)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.ones_like(model.model.embed_tokens.weight))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[token] = 1.0  # the hidden state is all ones after the norm: logit 64
    model.save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    return folder


class CorrectionsOnRankZeroOnly(L.Callback):
    def on_rollouts_scored(self, trainer, pl_module, step):
        if trainer.global_rank == 1:
            step.rewards = torch.ones_like(step.rewards)
        else:
            step.rewards = (torch.arange(len(step.rewards)) % 2).float()
