"""Callbacks for the multi-process tests, loaded by class path into ``python -m ibpo_lit fit``
runs (tests/ is on their PYTHONPATH).

- `RankRecorder`: each rank writes the prompts it trained on, every step's rollouts (token ids
  and seeds) and, at the end, the full weights (gathered from FSDP2 shards) and a digest.
- `ScriptedRewards`: replaces the verifier's rewards before the corrections see them, so the
  random tiny model gets mixed rewards (the math verifier almost never scores it right, and
  every advantage would be 0). ``mode: solved_groups`` also solves a third of the prompts (by
  uid) in every rollout: groups dynamic sampling drops. ``mode: unbalanced`` makes the ranks as different as possible:
  rank 0 gets all-zero rewards (no gradient anywhere); rank 1 gets mixed rewards, and some of
  its responses are replaced by one fixed text with an answer marker (duplicates: CIW cache
  hits; different lengths from rank 0's).
"""
import hashlib
import json
import os
import zlib

import lightning as L
import torch


def _full(tensor):
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


class RankRecorder(L.Callback):
    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.uids: list[list[str]] = []
        self.rollouts: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.uids.append([p.uid for p in batch])

    def on_rollouts_scored(self, trainer, pl_module, step):
        # Draws from torch's global generator, more on rank 1 than on rank 0, so the ranks'
        # generator states differ (a resume must give each rank its own back).
        self.draw = torch.rand(trainer.global_rank + 1).tolist()

    def on_before_update(self, trainer, pl_module, step):
        self.rollouts.append(
            {
                "step": step.step,
                "draw": getattr(self, "draw", None),
                "responses": step.rollouts.response_lists(),
                "seeds": step.rollouts.seeds.tolist(),
                "tool_tokens": step.rollouts.tool_mask.sum(dim=1).tolist(),
                "correction_prompts": pl_module.tokenizer.batch_decode(step.corrections.train_batch.prompt_lists())
                if step.corrections is not None and step.corrections.train_batch is not None
                else [],
                "rewards": step.rewards.tolist(),
                "corrections": step.corrections.train_batch.response_lists()
                if step.corrections is not None and step.corrections.train_batch is not None
                else [],
            }
        )

    def on_train_end(self, trainer, pl_module):
        weights = {}
        digest = hashlib.sha256()
        for name, p in pl_module.policy.state_dict().items():  # every rank: full_tensor is a collective
            weights[name] = _full(p).detach().cpu().float().clone()
        for name in sorted(weights):
            digest.update(name.encode())
            digest.update(weights[name].numpy().tobytes())
        rank = trainer.global_rank
        if rank == 0:
            torch.save(weights, os.path.join(self.out_dir, "weights.pt"))
        with open(os.path.join(self.out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"uids": self.uids, "weights": digest.hexdigest(), "world_size": trainer.world_size,
                       "steps": trainer.global_step, "rollouts": self.rollouts,
                       "vllm_cache_root": os.environ.get("VLLM_CACHE_ROOT")}, f)


class ScriptedRewards(L.Callback):
    """Rewards from a hash of each response (``hash``), or unbalanced ranks (``unbalanced``,
    ``idle_rank``: rank 1's rewards all equal, so it trains no row while rank 0 does)."""

    FIXED = "1 + 1 = 2 #### 2"

    def __init__(self, mode: str = "hash"):
        self.mode = mode

    def on_rollouts_scored(self, trainer, pl_module, step):
        responses = step.rollouts.response_lists()
        hashed = torch.tensor([float(zlib.crc32(bytes(r)) % 2) for r in responses])
        if self.mode == "hash":
            step.rewards = hashed
            return
        if self.mode == "idle_rank":  # rank 1's groups all tie: it trains no row, rank 0 does
            step.rewards = hashed if trainer.global_rank == 0 else torch.zeros(len(responses))
            return
        if self.mode == "solved_groups":  # a third of the prompts (by uid) solved by every rollout
            solved = [zlib.crc32(p.uid.encode()) % 3 == 0 for p in step.prompts]
            step.rewards = torch.where(torch.tensor([solved[g] for g in step.rollouts.group_index.tolist()]),
                                       torch.ones_like(hashed), hashed)
            return
        if trainer.global_rank == 0:
            step.rewards = torch.zeros(len(responses))
            return
        # Rank 1: rows 0, 1 and 3 of every group become one fixed answer (cache hits for CIW,
        # lengths unlike rank 0's), the rest keep their hashed rewards.
        ids = pl_module.tokenizer(self.FIXED, add_special_tokens=False).input_ids + [pl_module.tokenizer.eos_token_id]
        batch = step.rollouts
        fixed = torch.tensor(ids)
        width = max(batch.response_ids.shape[1], len(ids))
        pad = pl_module.tokenizer.pad_token_id
        response_ids = torch.nn.functional.pad(batch.response_ids, (0, width - batch.response_ids.shape[1]), value=pad)
        response_mask = torch.nn.functional.pad(batch.response_mask, (0, width - batch.response_mask.shape[1]))
        rollout_logp = torch.nn.functional.pad(batch.rollout_logp, (0, width - batch.rollout_logp.shape[1]))
        G = pl_module.rollout_cfg.group_size
        texts = list(step.texts)
        for row in range(len(responses)):
            if row % G in (0, 1, 3):
                response_ids[row] = pad
                response_ids[row, : len(ids)] = fixed
                response_mask[row] = False
                response_mask[row, : len(ids)] = True
                rollout_logp[row] = 0.0
                texts[row] = self.FIXED
                hashed[row] = 1.0
        batch.response_ids, batch.response_mask, batch.rollout_logp = response_ids, response_mask, rollout_logp
        step.texts = texts
        step.rewards = hashed
