"""What a separate vLLM server's workers need for ibpo-lit's weight sync (``--worker-extension-cls``).

A ``vllm serve`` started with ``--worker-extension-cls
ibpo_lit.rollout.vllm_server_worker.WeightSyncExtension`` (and ``VLLM_SERVER_DEV_MODE=1``, which
opens its ``/collective_rpc`` endpoint) gains the methods below on every worker; the trainer's
`VLLMServerEngine` calls them by name over HTTP. This is vLLM's documented way to add worker
methods (TRL's ``vllm-serve`` does the same); the file is imported inside the server's processes,
so it imports nothing of ibpo-lit beyond the LM-head refresh it shares with the colocated engine.

What is covered:
    * ``ibpo_identity``: the worker's process id and host, so an error can name the process that
      died or stalled, and so attaching checks that the extension is installed.
    * ``ibpo_load_weights(folder)``: vLLM's ``reload_weights`` from the safetensors a sync wrote
      (files, or shared memory under ``/dev/shm``), then the LM heads re-processed
      (`ibpo_lit.rollout.vllm_engine._refresh_lm_heads`: on the CPU a tied head otherwise keeps
      its matmul packed from the old embedding).

What is not covered: the NCCL route, which is vLLM's own ``/init_weight_transfer_engine`` and
``/update_weights`` endpoints (no worker method of ours).
"""
from __future__ import annotations

import os
import socket


class WeightSyncExtension:
    """Mixed into vLLM's worker class by vLLM itself (``self`` is the worker)."""

    def ibpo_identity(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def ibpo_load_weights(self, folder: str) -> int:
        from ibpo_lit.rollout.vllm_engine import _refresh_lm_heads

        self.reload_weights(weights_path=folder, is_checkpoint_format=True)
        return _refresh_lm_heads(self)
