"""`StalenessProbe`: what each rank of a ``python -m ibpo_lit fit`` run trained on and logged, for
tests/rollout/test_max_staleness.py's runs on 2 processes (loaded by class path; tests/scale is
on their PYTHONPATH).

Each rank writes ``rank<r>.json``: per step the batch it trained (its rollout step, the weights
version it was sampled with, the trainer's version, prompt uids, texts, the engine's sampled
log-probs), the metrics it logged (after the ranks' reduction: the same on every rank), and the
batch it holds in flight at the end. Rank 0 also writes the final full weights (gathered from
FSDP2's shards on every rank) to ``weights.pt``.
"""
import json
import os

import lightning as L
import torch

from multiprocess_probe import _full


class StalenessProbe(L.Callback):
    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.trained: list[dict] = []
        self.logged: list[dict] = []

    def on_before_update(self, trainer, pl_module, step):
        self.trained.append({"step": step.step, "sampled": step.weights_version, "trainer": pl_module.weights_version,
                             "uids": [p.uid for p in step.prompts], "texts": list(step.texts),
                             # float32 -> a Python float -> JSON and back is exact: compared bitwise
                             "logp": step.rollouts.rollout_logp.tolist()})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.logged.append({k: float(v) for k, v in trainer.callback_metrics.items()})

    def on_train_end(self, trainer, pl_module):
        ahead = pl_module._in_flight
        in_flight = None if ahead is None else {"step": ahead.scored.step, "sampled": ahead.scored.weights_version,
                                                "uids": [p.uid for p in ahead.scored.prompts]}
        os.makedirs(self.out_dir, exist_ok=True)
        # every rank: full_tensor is a collective
        weights = {k: _full(p).detach().cpu().float().clone() for k, p in pl_module.policy.state_dict().items()}
        if trainer.global_rank == 0:
            torch.save(weights, os.path.join(self.out_dir, "weights.pt"))
        with open(os.path.join(self.out_dir, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump({"trained": self.trained, "logged": self.logged, "in_flight": in_flight,
                       "world_size": trainer.world_size}, f)
