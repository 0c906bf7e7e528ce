"""``judge:<template>``: an LLM is asked about each response with a template; its reply, parsed,
is the reward.

What is covered:
    * The template: a built-in one by name (`JUDGE_TEMPLATES`: ``correctness``, a YES/NO
      comparison with the gold answer; ``score``, a 0-10 rating without one) or a text file
      (``judge:/path/to/template.txt``). Placeholders are ``{problem}`` (``Prompt.problem``),
      ``{response}`` (the decoded response) and ``{gold}`` (the record's answer); the first two
      are required, ``{gold}`` optional, anything else (``{answer}``, ``{}``) is an error at
      configuration time naming it. Literal braces are doubled (``{{``, ``}}``), as in
      ``str.format``. A response whose record has no gold is unscorable under a template that
      uses ``{gold}``.
    * The question is text: problem, response and gold are placed in one user message, tokenized
      with their special tokens split (`ibpo_lit.models.untrusted_text`), so a response cannot
      close the user turn and write the judge's answer itself. The judge tokenizer's chat
      template when it has one, else the text as is.
    * The parser (``options.parser``; a built-in template brings its own) reads only a
      well-formed verdict within its declared range (`ibpo_lit.model_rewards.verdicts`:
      ``yes_no``, ``score_0_1``, ``score_0_10``, ``regex:<pattern>`` with ``options.score_range``;
      ``options.label`` reads it from a ``<label>:`` line).
    * A response cannot profit from breaking its judge: a reply without a well-formed verdict,
      and a question longer than the judge takes (``options.max_question_tokens``, default the
      judge's context minus ``max_new_tokens``; refused before it is asked, and past
      ``max_question_tokens`` times the longest vocabulary entry's characters before it is even
      tokenized), score the judge's
      minimum (the low end of the parser's range), counted (``reward/<label>_penalized``, the
      first of each kind logged at WARNING). Faults that are not the response's stay unscorable
      (None, counted): a record without the gold the template needs, a template and record that
      alone do not fit, an engine that raises (the whole batch), the time limit.
    * The time limit (``options.time_limit_s``) on one scoring call: the questions are asked in
      batches of ``options.batch_size``, every rank asking as many batches as the busiest one
      (`RankSync.max`; a rank with none asks with no questions: ``generate`` is a collective
      under FSDP2 and tensor parallelism), and before each batch the ranks agree whether any is
      past the limit (`ibpo_lit.scale.deadline.Deadline`). Past it, every rank stops at the same
      batch, and the questions not asked are unscorable (counted in ``train/reward_timeouts``,
      the message naming rank, phase and weights' version). A batch in progress is not
      interrupted: the overrun is at most one batch.
    * The judging LLM (``options.model``): ``policy`` (default) asks the policy itself through
      the rollout engine's ``generate`` (HF or vLLM), with the policy's tokenizer, both handed
      over by the trainer (`ModelRewardContext`); a folder, hub id or built-in name loads a
      separate causal LM on the trainer's device (sharded under FSDP2 like the policy) and asks
      it through an HF engine.
    * Deterministic decoding: greedy (``top_k = 1``), at most ``options.max_new_tokens`` tokens
      (default 16), and each question's seed is a function of its text and ``rollout.seed``, so
      the same question gets the same reply in any batch.

What is not covered:
    * Persuasion in words: a response that argues its case in plain text may still sway the
      judge's verdict; only the verdict's form is checked (docs/sandbox.md).
    * Judges served over HTTP (an import-path reward can call one: docs/rewards.md), pairwise
      or listwise judging, several samples per question, reasoning-length budgets.
    * Interrupting one ``generate`` call between decode steps (the engines have no hook for it).
    * A policy judge sees the weights of the moment: its verdicts move as it trains (that is the
      point of self-judging, and a reason to prefer a separate model for a stable reward).
"""
from __future__ import annotations

import logging
import os
import string
import zlib
from dataclasses import dataclass
from typing import Optional

from ibpo_lit.errors import ConfigError
from ibpo_lit.model_rewards.context import ModelRewardContext
from ibpo_lit.model_rewards.runner import ScoringReport, check_time_limit
from ibpo_lit.model_rewards.verdicts import JUDGE_PARSERS, REGEX_PREFIX, VerdictParser, check_score_range, get_parser
from ibpo_lit.models.untrusted_text import chat_ids, plain_ids
from ibpo_lit.registry import Registry
from ibpo_lit.rollout.engine import SamplingConfig
from ibpo_lit.scale.deadline import Deadline

logger = logging.getLogger(__name__)

PLACEHOLDERS = ("problem", "response", "gold")
REQUIRED = ("problem", "response")
POLICY = "policy"


@dataclass(frozen=True)
class JudgeTemplate:
    """A question with placeholders (``{problem}``, ``{response}``, ``{gold}``) and the parser
    that reads the judge's reply (a name in `JUDGE_PARSERS` or ``regex:<pattern>``; None for a
    template from a file: then ``options.parser`` says)."""

    text: str
    parser: Optional[str] = None


JUDGE_TEMPLATES = Registry("judge template")
JUDGE_TEMPLATES.register("correctness")(JudgeTemplate(
    "You are grading a response to a problem against the reference answer.\n\n"
    "Problem:\n{problem}\n\nReference answer:\n{gold}\n\nResponse:\n{response}\n\n"
    "Is the response's final answer equal to the reference answer? Reply with YES or NO only.",
    parser="yes_no",
))
JUDGE_TEMPLATES.register("score")(JudgeTemplate(
    "Rate how well the response solves the problem, from 0 (wrong or useless) to 10 (correct and clear).\n\n"
    "Problem:\n{problem}\n\nResponse:\n{response}\n\nReply with the number only.",
    parser="score_0_10",
))


# ---------------------------------------------------------------- templates
def check_template(text: str, where: str) -> tuple[str, ...]:
    """The placeholders ``text`` uses; ConfigError naming a missing required one, an unknown one,
    a positional ``{}`` or bad braces."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as e:
        raise ConfigError(f"{where}: the template's braces do not parse ({e}); write literal braces as {{{{ and }}}}") from e
    names = []
    for field in fields:
        if field == "" or not field.isidentifier():
            raise ConfigError(f"{where}: the template holds {{{field}}}; placeholders are "
                              f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)} (literal braces are doubled)")
        if field not in PLACEHOLDERS:
            raise ConfigError(f"{where}: unknown placeholder {{{field}}} in the template; valid: "
                              f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
        names.append(field)
    missing = [p for p in REQUIRED if p not in names]
    if missing:
        raise ConfigError(f"{where}: the template has no {{{missing[0]}}} placeholder; a judge template needs "
                          f"{' and '.join('{' + p + '}' for p in REQUIRED)} ({{gold}} is optional)")
    return tuple(dict.fromkeys(names))


def load_template(target: str) -> JudgeTemplate:
    """A built-in template by name, or a template file's text (its parser None: the options say).

    Raises:
        ConfigError: neither a built-in name nor a readable file, or a bad template.
    """
    where = f"judge:{target}"
    if target in JUDGE_TEMPLATES:
        template = JUDGE_TEMPLATES[target]
    else:
        path = os.path.expanduser(target)
        if not os.path.isfile(path):
            raise ConfigError(f"{where}: not a built-in judge template ({', '.join(JUDGE_TEMPLATES.names())}) "
                              "nor a template file")
        with open(path, encoding="utf-8") as f:
            template = JudgeTemplate(f.read())
    check_template(template.text, where)
    return template


# ---------------------------------------------------------------- the judge
DEFAULT_BATCH_SIZE = 64


@dataclass(frozen=True)
class JudgeOptions:
    """``options`` of a ``judge:`` reward (``model.rewards``).

    Args:
        model: ``policy`` (ask the policy through the rollout engine) or a causal LM's folder,
            hub id or built-in name (loaded once, on the trainer's device).
        parser: How a reply becomes a score (`ibpo_lit.model_rewards.verdicts`); default the
            built-in template's own (a template file needs one).
        score_range: ``[low, high]`` of a ``regex:`` parser's scores (required there; the
            built-in parsers have their own). ``low`` is the judge's minimum.
        label: Read the verdict from the reply's one line that starts with ``<label>:`` (e.g.
            ``Verdict``), for templates that ask for reasoning first; None: the whole reply.
        max_new_tokens: Longest reply, in tokens.
        max_question_tokens: Longest question asked, in the judge's tokens; a longer one scores
            the minimum without being asked. Default: the judge's context minus max_new_tokens.
        batch_size: Questions per ``generate`` call (the time limit is checked between calls).
        time_limit_s: Seconds one scoring call may take, agreed by every rank; the questions not
            asked by then are unscorable. None: no limit.
    """

    model: str = POLICY
    parser: Optional[str] = None
    score_range: Optional[list] = None
    label: Optional[str] = None
    max_new_tokens: int = 16
    max_question_tokens: Optional[int] = None
    batch_size: int = DEFAULT_BATCH_SIZE
    time_limit_s: Optional[float] = 600.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"judge options: model must be 'policy' or a model's path, got {self.model!r}")
        for key in ("max_new_tokens", "batch_size", "max_question_tokens"):
            value = getattr(self, key)
            if value is None and key == "max_question_tokens":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"judge options: {key} must be an integer >= 1, got {value!r}")
        check_score_range(self.score_range)
        if self.label is not None and (not isinstance(self.label, str) or not self.label.strip()
                                       or any(c in self.label for c in ":\n")):
            raise ConfigError(f"judge options: label must be a word such as 'Verdict' (no colon, one line), "
                              f"got {self.label!r}")
        check_time_limit(self.time_limit_s, "judge options")


def check_judge(target: str, options: JudgeOptions) -> tuple[JudgeTemplate, VerdictParser]:
    """The template and the parser of ``judge:<target>``, checked without loading a model."""
    from ibpo_lit.models.loading import check_model_path

    template = load_template(target)
    parser = options.parser or template.parser
    if parser is None:
        raise ConfigError(f"judge:{target}: a template from a file needs options.parser ("
                          f"{', '.join(JUDGE_PARSERS.names())} or {REGEX_PREFIX}<pattern>), in model.rewards: "
                          f"{{name: 'judge:{target}', options: {{parser: yes_no}}}}")
    if options.model != POLICY:
        check_model_path(options.model)
    try:
        return template, get_parser(parser, options.score_range, options.label)
    except ConfigError as e:
        raise ConfigError(f"judge:{target}: {e}") from None


class Judge:
    """Asks an LLM about each (problem, response[, gold]) and parses its reply (module docstring).

    Called as every reward is: ``judge(prompts, completions, gold=..., **columns)``; after a call,
    ``last_replies`` holds each reply (None: not asked) and ``last_report`` what was penalized or
    left unscored by the time limit (`ScoringReport`).

    Args:
        target: The template's name or file (what follows ``judge:``).
        ctx: The run's device, collectives, plan and, for ``model: policy``, the engine's
            ``generate`` and the policy's tokenizer.
        options: `JudgeOptions`.
    """

    def __init__(self, target: str, ctx: ModelRewardContext, options: JudgeOptions = JudgeOptions()):
        self.name = f"judge:{target}"
        self.template, self.parse = check_judge(target, options)
        self.minimum = self.parse.low
        self.uses_gold = "gold" in check_template(self.template.text, self.name)
        self.seed, self.sync, self.weights_version = ctx.seed, ctx.sync, ctx.weights_version
        self.batch_size, self.time_limit_s = options.batch_size, options.time_limit_s
        self.sampling = SamplingConfig(temperature=1.0, top_k=1, max_new_tokens=options.max_new_tokens)
        self._model = None
        if options.model == POLICY:
            if ctx.generate is None or ctx.tokenizer is None:
                raise ValueError(f"{self.name}: the policy as judge needs the rollout engine's generate and the "
                                 "policy's tokenizer (ModelRewardContext)")
            self.tokenizer, self.generate, context_limit = ctx.tokenizer, ctx.generate, ctx.context_limit
        else:
            self.tokenizer, self.generate, context_limit = self._own_engine(options.model, ctx)
        self.max_question_tokens = _question_budget(self.name, context_limit, options)
        # No token stands for more characters than its vocabulary entry has: a question longer
        # than this many characters is too long without being tokenized.
        self.max_question_chars = self.max_question_tokens * _longest_token(self.tokenizer)
        self.last_replies: list[Optional[str]] = []  # the last call's replies (None: not asked)
        self.last_report = ScoringReport()
        self._warned: set[str] = set()

    def _own_engine(self, name: str, ctx: ModelRewardContext):
        from ibpo_lit.models.loading import eos_token_ids, load_policy, load_sharded_policy
        from ibpo_lit.rollout.hf import HFRolloutEngine

        if ctx.plan is not None:
            model, tokenizer = load_sharded_policy(name, ctx.plan, dtype=ctx.dtype, seed=ctx.seed)
        else:
            model, tokenizer = load_policy(name, dtype=ctx.dtype, seed=ctx.seed)
            model = model.to(ctx.device)
        self._model = model.eval().requires_grad_(False)
        engine = HFRolloutEngine(model, eos_token_ids(model, tokenizer), tokenizer.pad_token_id, self.sampling,
                                 reshard_after_forward=ctx.plan.reshard_after_forward if ctx.plan is not None else True)
        limit = getattr(model.config, "max_position_embeddings", None)
        return tokenizer, engine.generate, limit if isinstance(limit, int) else None

    def question(self, problem: str, response: str, gold: Optional[str]) -> Optional[str]:
        """The filled template; None when it needs a gold the record lacks."""
        if self.uses_gold and gold is None:
            return None
        return self.template.text.format(problem=problem, response=response, gold="" if gold is None else gold)

    def encode(self, question: str) -> list[int]:
        """The question as the judge's prompt: one user turn in its chat template, else as is;
        the question's text is text (`ibpo_lit.models.untrusted_text`)."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            return chat_ids(tok, [{"role": "user", "content": question}], add_generation_prompt=True)
        return plain_ids(tok, question)

    def __call__(self, prompts: list[str], completions: list[str], gold: Optional[list] = None,
                 **_) -> list[Optional[float]]:
        golds = gold if gold is not None else [None] * len(completions)
        out: list[Optional[float]] = [None] * len(completions)
        self.last_replies = [None] * len(completions)
        report = self.last_report = ScoringReport()
        asked, ids = [], []
        for i, (p, c, g) in enumerate(zip(prompts, completions, golds)):
            question = self.question(p, c, g)
            if question is None:
                continue  # the record has no gold: not the response's doing
            tokens = self.encode(question) if len(question) <= self.max_question_chars else None
            if tokens is None or len(tokens) > self.max_question_tokens:
                if self._fits(self.question(p, "", g)):
                    out[i] = self._penalize(report, "too long", f"a question of {len(question)} characters, longer "
                                            f"than max_question_tokens={self.max_question_tokens} tokens")
                continue  # else the template and the record alone do not fit: unscorable
            asked.append(i)
            ids.append(tokens)
        seeds = [(zlib.crc32(bytes(str(t), "utf-8")) + 1_000_003 * self.seed) % 2**31 for t in ids]
        batches = [range(k, min(k + self.batch_size, len(ids))) for k in range(0, len(ids), self.batch_size)]
        # Every rank asks as often as the busiest one (a collective under FSDP2 / TP), and all
        # agree before each batch whether the time limit has passed on any of them.
        calls = self.sync.max(len(batches))
        deadline = Deadline(f"{self.name} scoring", self.time_limit_s, self.sync, self.weights_version())
        for k in range(calls):
            if deadline.passed():
                report.timed_out = sum(len(b) for b in batches[k:])
                report.timeout_message = deadline.message()
                break
            batch = batches[k] if k < len(batches) else range(0)
            result = self.generate([ids[j] for j in batch], n=1, seeds=[seeds[j] for j in batch],
                                   sampling=self.sampling)
            replies = self.tokenizer.batch_decode(result.response_lists(), skip_special_tokens=True) if batch else []
            for j, reply in zip(batch, replies):
                i = asked[j]
                self.last_replies[i] = reply
                out[i] = self.parse(reply)
                if out[i] is None:
                    out[i] = self._penalize(report, "off format",
                                            f"a reply without a well-formed verdict ({reply[:200]!r})")
        return out

    def _fits(self, question: str) -> bool:
        return len(question) <= self.max_question_chars and len(self.encode(question)) <= self.max_question_tokens

    def _penalize(self, report: ScoringReport, kind: str, what: str) -> float:
        """The judge's minimum for a response that broke it, counted; the first of each kind logged."""
        report.penalized += 1
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning("%s: %s scores the judge's minimum %g (counted in reward/<label>_penalized); later ones "
                           "are not logged", self.name, what, self.minimum)
        return self.minimum

    def close(self) -> None:
        self._model = None


def _longest_token(tokenizer) -> int:
    """The most characters one token of ``tokenizer`` stands for, at most: its longest
    vocabulary entry (a byte-level entry spells each byte as a character)."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return max((len(t) for t in vocab), default=1) or 1


def _question_budget(name: str, context_limit: Optional[int], options: JudgeOptions) -> int:
    """The longest question asked: ``max_question_tokens``, within the judge's context minus the reply."""
    limits = [options.max_question_tokens] if options.max_question_tokens is not None else []
    if context_limit is not None:
        limits.append(context_limit - options.max_new_tokens)
    if not limits:
        raise ValueError(f"{name}: the judge's context length is unknown; set options.max_question_tokens")
    if min(limits) < 1:
        raise ValueError(f"{name}: max_new_tokens={options.max_new_tokens} leaves no room for a question in the judge's "
                         f"context of {context_limit} tokens")
    return min(limits)
