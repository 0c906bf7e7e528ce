"""A callback for tests/test_multiprocess.py, loaded by class path in a 2-process run: each
rank writes the prompts it trained on and a digest of its final weights."""
import hashlib
import json
import os

import lightning as L


class RankRecorder(L.Callback):
    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.uids: list[list[str]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.uids.append([p.uid for p in batch])

    def on_train_end(self, trainer, pl_module):
        digest = hashlib.sha256()
        for name, p in sorted(pl_module.policy.state_dict().items()):
            digest.update(name.encode())
            digest.update(p.detach().cpu().float().numpy().tobytes())
        path = os.path.join(self.out_dir, f"rank{trainer.global_rank}.json")
        with open(path, "w") as f:
            json.dump({"uids": self.uids, "weights": digest.hexdigest(), "world_size": trainer.world_size,
                       "steps": trainer.global_step}, f)
