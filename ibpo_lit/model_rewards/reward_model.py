"""``reward_model:<path or hub id>``: a sequence classifier's logit is the reward.

What is covered:
    * Loading: ``AutoTokenizer`` and ``AutoModelForSequenceClassification`` from a local folder
      (``save_pretrained``, TRL's ``RewardTrainer`` output) or a hub id, in ``model.dtype`` (or
      ``options.dtype``), on the policy's device, in eval mode, frozen, dropout off. Under
      FSDP2 it is sharded like the policy (`ibpo_lit.scale.fsdp2.build_sharded`: rank 0 reads
      the weights once, every rank keeps a shard).
    * Checked before any weight loads (`check_reward_model`, at configuration time): the folder
      exists, its ``config.json`` names a ``*ForSequenceClassification`` architecture, and it has
      one output (``num_labels: 1``). A model with several labels is refused: which label, or
      which combination, is the reward is the user's decision (write a reward function).
    * The text scored: with the reward model's chat template when its tokenizer has one, the
      conversation ``[user: problem, assistant: response]`` (TRL's conversational reward data);
      without one, ``problem + response`` concatenated as they are (TRL's standard format),
      with the special tokens the tokenizer adds of its own (a BOS). Problem and response are
      text: their special tokens are split (`ibpo_lit.models.untrusted_text`), so a response
      cannot close its turn and open a user turn of its choosing. The problem is
      ``Prompt.problem`` (the record's question, not the chat-templated prompt the policy saw).
    * Truncation to ``max_length`` tokens (``options.max_length``; default the smaller of the
      tokenizer's ``model_max_length`` and the model's ``max_position_embeddings``), by
      ``options.truncation``: ``left`` (default) keeps the last tokens, where the score is read
      (the response's end); ``right`` keeps the first; ``refuse`` scores a text that is too long
      ``min_score`` (counted as penalized) without a forward, or None (unscorable) when the
      problem alone is too long (not the response's doing). A truncation is logged once at
      WARNING.
    * A declared minimum, ``options.min_score`` (default -100): what a refused text scores, and
      the floor of every score (a lower one is raised to it, logged once), so a response never
      scores better by breaking the reward model than by being scored.
    * Scoring: batches of ``options.batch_size`` (else ``model.reward_batch_size``, else 16)
      rows, right-padded (so positions and causal attention of the real tokens are those of the
      unpadded text), under ``torch.no_grad()``. The score is Hugging Face's own pooling: the
      logit at the last token that is not the pad token (as the model was trained with TRL).
      The same text gets the same score alone or in any batch. A NaN or infinite score is None
      (unscorable: the model's numerics, not a verdict).
    * The time limit (``options.time_limit_s``) on one scoring call, checked before each forward;
      sharded, the ranks agree on it (`ibpo_lit.scale.deadline.Deadline`) and stop at the same
      forward. The texts not scored by then are unscorable, counted in
      ``train/reward_timeouts`` with a message naming rank, phase and weights' version. A
      forward in progress is not interrupted.
    * Sharded (FSDP2): each forward is a collective, so every rank runs as many forwards as the
      rank with the most batches (`RankSync.max`), the others a one-token forward whose output
      is dropped; a rank with no responses takes part the same way. Every rank must call the
      reward equally often, which the trainer's scoring points guarantee.

What is not covered:
    * Several outputs (``num_labels > 1``), pairwise (Bradley-Terry) comparison of responses,
      process (per-step) reward models.
    * Conversational prompts as lists of messages (a conversation's text form is the user turn).
    * Tensor parallelism of the reward model; vLLM scoring; CPU offload of its shards.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional

import torch

from ibpo_lit.errors import ConfigError
from ibpo_lit.model_rewards.context import ModelRewardContext
from ibpo_lit.model_rewards.runner import ScoringReport, check_time_limit
from ibpo_lit.models.loading import BUILTIN_MODELS, DTYPES, check_model_path, disable_dropout, resolve_model_path
from ibpo_lit.models.untrusted_text import chat_ids, plain_ids
from ibpo_lit.scale.collectives import SINGLE_PROCESS
from ibpo_lit.scale.deadline import Deadline

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 16
TRUNCATIONS = ("left", "right", "refuse")
DEFAULT_MIN_SCORE = -100.0  # a floor far below the logits reward models usually give
_REFUSED = object()  # `_bounded`'s answer for a text refused as too long (it scores min_score)


@dataclass(frozen=True)
class RewardModelOptions:
    """``options`` of a ``reward_model:`` reward (``model.rewards``).

    Args:
        batch_size: Responses per forward (default ``model.reward_batch_size``, else 16).
        max_length: Longest text scored, in the reward model's tokens (default: its own limit).
        truncation: A longer text: ``left`` keeps its last ``max_length`` tokens (the response's
            end, where the score is read), ``right`` its first, ``refuse`` scores it min_score.
        dtype: Weights' dtype (``float32``, ``bfloat16``, ``float16``; default ``model.dtype``).
        min_score: The reward model's declared minimum: what a refused text scores, and the
            floor of every score. Set it at or below your model's lowest scores.
        time_limit_s: Seconds one scoring call may take (checked between forwards, agreed by the
            ranks when sharded); the texts not scored by then are unscorable. None: no limit.
    """

    batch_size: Optional[int] = None
    max_length: Optional[int] = None
    truncation: str = "left"
    dtype: Optional[str] = None
    min_score: float = DEFAULT_MIN_SCORE
    time_limit_s: Optional[float] = 600.0

    def __post_init__(self) -> None:
        for key in ("batch_size", "max_length"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"reward_model options: {key} must be an integer >= 1 or unset, got {value!r}")
        if self.truncation not in TRUNCATIONS:
            raise ConfigError(f"reward_model options: truncation must be one of {', '.join(TRUNCATIONS)}, "
                              f"got {self.truncation!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"reward_model options: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if isinstance(self.min_score, bool) or not isinstance(self.min_score, (int, float)) \
                or not math.isfinite(self.min_score):
            raise ConfigError(f"reward_model options: min_score must be a finite number, got {self.min_score!r}")
        check_time_limit(self.time_limit_s, "reward_model options")


def check_reward_model(target: str) -> str:
    """Check, without loading weights, that ``target`` is a reward model ibpo-lit can score
    with; returns what ``from_pretrained`` loads (a folder or a hub id).

    Raises:
        ConfigError: a built-in policy name, a folder that is not a model, a model that is not a
            sequence classifier or has more than one label, a hub id whose config cannot be read.
    """
    from transformers import AutoConfig

    spec = f"reward_model:{target}"
    if target in BUILTIN_MODELS:
        raise ConfigError(f"{spec}: {target!r} is a causal LM built in code, not a reward model; give the folder or "
                          "hub id of an AutoModelForSequenceClassification with num_labels=1")
    try:
        check_model_path(target)
        source = resolve_model_path(target)
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{spec}: cannot read the reward model's config ({type(e).__name__}: {e})") from e
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ConfigError(
            f"{spec}: not a sequence-classification model (its config.json lists architectures {architectures}); "
            "a reward model is saved from AutoModelForSequenceClassification with num_labels=1 (what TRL's "
            "RewardTrainer writes). For an LLM that answers in words, use a judge: judge:<template> "
            "(docs/reward_models.md)"
        )
    if config.num_labels != 1:
        raise ConfigError(
            f"{spec}: the model has {config.num_labels} outputs (num_labels={config.num_labels}); a reward model "
            "has one, its logit being the score. Which label is the reward is yours to say: load it in a reward "
            "function of your own (docs/rewards.md)"
        )
    return source


class RewardModel:
    """A sequence classifier scoring (problem, response) pairs (see the module docstring).

    Called as every reward is: ``rm(prompts, completions, **columns) -> list[float | None]``;
    after a call, ``last_report`` says how many texts were refused (penalized) or left unscored by
    the time limit (`ScoringReport`).

    Args:
        target: The model's folder or hub id (what follows ``reward_model:``).
        ctx: Device, collectives and FSDP2 plan of the run.
        options: `RewardModelOptions`.
    """

    def __init__(self, target: str, ctx: ModelRewardContext, options: RewardModelOptions = RewardModelOptions()):
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        source = check_reward_model(target)
        self.name, self.ctx, self.options = f"reward_model:{target}", ctx, options
        dtype = DTYPES[options.dtype or ctx.dtype]
        tokenizer = AutoTokenizer.from_pretrained(source)
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None:
                raise ConfigError(f"{self.name}: its tokenizer has neither a pad nor an eos token to pad batches with")
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"
        self.tokenizer = tokenizer
        config = AutoConfig.from_pretrained(source)
        disable_dropout(config)
        if ctx.plan is not None:
            from ibpo_lit.scale.fsdp2 import build_sharded

            model = build_sharded(
                lambda: AutoModelForSequenceClassification.from_config(config, dtype=dtype),
                lambda: AutoModelForSequenceClassification.from_pretrained(source, config=config, dtype=dtype).state_dict(),
                ctx.plan,
            )
        else:
            model = AutoModelForSequenceClassification.from_pretrained(source, config=config, dtype=dtype)
            model = model.to(ctx.device)
        disable_dropout(model)
        model.config.pad_token_id = tokenizer.pad_token_id  # Hugging Face's pooling finds the last non-pad token
        self.model = model.eval().requires_grad_(False)
        self.max_length = options.max_length or _own_limit(tokenizer, model.config)
        self.batch_size = options.batch_size or ctx.batch_size or DEFAULT_BATCH_SIZE
        self.truncated = 0  # texts longer than max_length so far
        self.last_report = ScoringReport()
        self._floor_warned = False
        self.device = next(model.parameters()).device if ctx.plan is None else ctx.plan.device

    # ---------------------------------------------------------------- the text
    def encode(self, problem: str, response: str) -> list[int]:
        """The token ids scored for one pair, before truncation (see the module docstring)."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            return chat_ids(tok, [{"role": "user", "content": problem}, {"role": "assistant", "content": response}])
        return plain_ids(tok, problem + response)

    def _bounded(self, problem: str, response: str):
        """The pair's ids within ``max_length`` (cut by ``options.truncation``); `_REFUSED` for a
        text refused as too long; None when, refusing, the problem alone is too long (not the
        response's doing: unscorable)."""
        ids = self.encode(problem, response)
        if self.max_length is None or len(ids) <= self.max_length:
            return ids
        self.truncated += 1
        refuse = self.options.truncation == "refuse"
        if self.truncated == 1:
            logger.warning("%s: a text of %d tokens is longer than max_length=%d: %s (options.truncation); "
                           "later ones are not logged", self.name, len(ids), self.max_length,
                           f"scored min_score={self.options.min_score:g}" if refuse else
                           f"cut on the {self.options.truncation}")
        if refuse:
            return _REFUSED if len(self.encode(problem, "")) <= self.max_length else None
        return ids[-self.max_length:] if self.options.truncation == "left" else ids[: self.max_length]

    # ---------------------------------------------------------------- scoring
    def __call__(self, prompts: list[str], completions: list[str], **_) -> list[Optional[float]]:
        report = self.last_report = ScoringReport()
        rows = [self._bounded(p, c) for p, c in zip(prompts, completions)]
        out: list[Optional[float]] = [None] * len(rows)
        for i, ids in enumerate(rows):
            if ids is _REFUSED:
                out[i] = self.options.min_score
                report.penalized += 1
        order = sorted((i for i, ids in enumerate(rows) if isinstance(ids, list)), key=lambda i: len(rows[i]))
        batches = [order[i: i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        # Sharded: every forward is a collective; the ranks run as many as the busiest one, and
        # agree before each whether the time limit has passed on any of them.
        sync = self.ctx.sync if self.ctx.plan is not None else SINGLE_PROCESS
        forwards = sync.max(len(batches))
        deadline = Deadline(f"{self.name} scoring", self.options.time_limit_s, sync, self.ctx.weights_version())
        with torch.no_grad():
            for k in range(forwards):
                if deadline.passed():
                    report.timed_out = sum(len(b) for b in batches[k:])
                    report.timeout_message = deadline.message()
                    break
                if k >= len(batches):
                    self._forward([[self.tokenizer.pad_token_id]])  # keeps step with the other ranks
                    continue
                scores = self._forward([rows[i] for i in batches[k]])
                for i, value in zip(batches[k], scores):
                    out[i] = self._floored(value) if math.isfinite(value) else None
        return out

    def _floored(self, value: float) -> float:
        """``value``, raised to ``min_score`` if below it (logged once): a text refused as too
        long must never score less than one the model scored."""
        if value >= self.options.min_score:
            return value
        if not self._floor_warned:
            self._floor_warned = True
            logger.warning("%s: a score of %g is below options.min_score=%g and is raised to it; set min_score at or "
                           "below the model's lowest scores. Later ones are not logged", self.name, value,
                           self.options.min_score)
        return self.options.min_score

    def _forward(self, rows: list[list[int]]) -> list[float]:
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=self.device)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=self.device)
        logits = self.model(input_ids=input_ids, attention_mask=mask).logits  # [B, 1]
        return logits[:, 0].float().cpu().tolist()

    def close(self) -> None:
        self.model = None


def _own_limit(tokenizer, config) -> Optional[int]:
    """The smaller of the tokenizer's ``model_max_length`` (when it is a real one) and the
    model's ``max_position_embeddings``; None when neither is known."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limits = [getattr(text, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    limits = [x for x in limits if isinstance(x, int) and 0 < x < 10**7]  # tokenizers say 1e30 for "none"
    return min(limits) if limits else None

