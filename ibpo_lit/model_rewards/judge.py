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
    * The parser (`JUDGE_PARSERS`, ``options.parser``; a built-in template brings its own):
      ``yes_no`` (the first word YES or NO, any case: 1 / 0), ``score_0_1`` (the first number,
      which must lie in [0, 1]), ``score_0_10`` (the first number in [0, 10], divided by 10), or
      ``regex:<pattern>`` (the first match's group 1, or the whole match without a group, read
      as a number). A reply that does not parse is unscorable (None, counted in
      ``train/reward_none``), never 0; the first such reply is logged at WARNING with its text.
    * The judging LLM (``options.model``): ``policy`` (default) asks the policy itself through
      the rollout engine's ``generate`` (HF or vLLM), with the policy's tokenizer, both handed
      over by the trainer (`ModelRewardContext`); a folder, hub id or built-in name loads a
      separate causal LM on the trainer's device (sharded under FSDP2 like the policy) and asks
      it through an HF engine. The question is the filled template as one user message, in the
      judge tokenizer's chat template when it has one (else the text as is).
    * Deterministic decoding: greedy (``top_k = 1``), at most ``options.max_new_tokens`` tokens
      (default 16), and each question's seed is a function of its text and ``rollout.seed``, so
      the same question gets the same reply in any batch. A question longer than the judge's
      context (minus ``max_new_tokens``) is unscorable.
    * Every rank calls ``generate`` once per scoring call, with no questions where it has none
      (the engine's collectives under FSDP2 or tensor parallelism).

What is not covered:
    * Judges served over HTTP (an import-path reward can call one: docs/rewards.md), pairwise
      or listwise judging, several samples per question, reasoning-length budgets.
    * A policy judge sees the weights of the moment: its verdicts move as it trains (that is the
      point of self-judging, and a reason to prefer a separate model for a stable reward).
"""
from __future__ import annotations

import logging
import os
import re
import string
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

from ibpo_lit.errors import ConfigError
from ibpo_lit.model_rewards.context import ModelRewardContext
from ibpo_lit.models.untrusted_text import chat_ids, plain_ids
from ibpo_lit.registry import Registry
from ibpo_lit.rollout.engine import SamplingConfig

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


# ---------------------------------------------------------------- parsers: reply -> score or None
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)")


def _first_number(reply: str) -> Optional[float]:
    m = _NUMBER.search(reply)
    return float(m.group(0)) if m else None


def parse_yes_no(reply: str) -> Optional[float]:
    """1.0 for YES, 0.0 for NO: the first of the two words in the reply (any case); None without one."""
    m = re.search(r"\b(yes|no)\b", reply, re.IGNORECASE)
    return None if m is None else float(m.group(1).lower() == "yes")


def parse_score_0_1(reply: str) -> Optional[float]:
    """The reply's first number, when it lies in [0, 1]; None otherwise."""
    x = _first_number(reply)
    return x if x is not None and 0.0 <= x <= 1.0 else None


def parse_score_0_10(reply: str) -> Optional[float]:
    """The reply's first number divided by 10, when it lies in [0, 10]; None otherwise."""
    x = _first_number(reply)
    return x / 10.0 if x is not None and 0.0 <= x <= 10.0 else None


JUDGE_PARSERS = Registry("judge parser")
JUDGE_PARSERS.register("yes_no")(parse_yes_no)
JUDGE_PARSERS.register("score_0_1")(parse_score_0_1)
JUDGE_PARSERS.register("score_0_10")(parse_score_0_10)
REGEX_PREFIX = "regex:"


def get_parser(name: str) -> Callable[[str], Optional[float]]:
    """A parser by name, or ``regex:<pattern>`` (group 1, else the whole match, as a number).

    Raises:
        ConfigError: an unknown name (listing the valid ones) or a pattern that does not compile.
    """
    if isinstance(name, str) and name.startswith(REGEX_PREFIX):
        try:
            pattern = re.compile(name[len(REGEX_PREFIX):])
        except re.error as e:
            raise ConfigError(f"judge parser {name!r}: the pattern does not compile ({e})") from e

        def parse_regex(reply: str) -> Optional[float]:
            m = pattern.search(reply)
            if m is None:
                return None
            try:
                return float(m.group(1) if pattern.groups else m.group(0))
            except (TypeError, ValueError):
                return None

        return parse_regex
    if name not in JUDGE_PARSERS:
        raise ConfigError(f"unknown judge parser {name!r}; valid: {', '.join(JUDGE_PARSERS.names())}, "
                          f"or {REGEX_PREFIX}<pattern>")
    return JUDGE_PARSERS[name]


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
@dataclass(frozen=True)
class JudgeOptions:
    """``options`` of a ``judge:`` reward (``model.rewards``).

    Args:
        model: ``policy`` (ask the policy through the rollout engine) or a causal LM's folder,
            hub id or built-in name (loaded once, on the trainer's device).
        parser: How a reply becomes a score (`get_parser`); default the built-in template's
            own (a template file needs one).
        max_new_tokens: Longest reply, in tokens.
    """

    model: str = POLICY
    parser: Optional[str] = None
    max_new_tokens: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"judge options: model must be 'policy' or a model's path, got {self.model!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"judge options: max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")


def check_judge(target: str, options: JudgeOptions) -> tuple[JudgeTemplate, Callable[[str], Optional[float]]]:
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
        return template, get_parser(parser)
    except ConfigError as e:
        raise ConfigError(f"judge:{target}: {e}") from None


class Judge:
    """Asks an LLM about each (problem, response[, gold]) and parses its reply (module docstring).

    Called as every reward is: ``judge(prompts, completions, gold=..., **columns)``.

    Args:
        target: The template's name or file (what follows ``judge:``).
        ctx: The run's device, collectives, plan and, for ``model: policy``, the engine's
            ``generate`` and the policy's tokenizer.
        options: `JudgeOptions`.
    """

    def __init__(self, target: str, ctx: ModelRewardContext, options: JudgeOptions = JudgeOptions()):
        self.name = f"judge:{target}"
        self.template, self.parse = check_judge(target, options)
        self.uses_gold = "gold" in check_template(self.template.text, self.name)
        self.seed = ctx.seed
        self.sampling = SamplingConfig(temperature=1.0, top_k=1, max_new_tokens=options.max_new_tokens)
        self._model = None
        if options.model == POLICY:
            if ctx.generate is None or ctx.tokenizer is None:
                raise ValueError(f"{self.name}: the policy as judge needs the rollout engine's generate and the "
                                 "policy's tokenizer (ModelRewardContext)")
            self.tokenizer, self.generate, self.context_limit = ctx.tokenizer, ctx.generate, ctx.context_limit
        else:
            self.tokenizer, self.generate, self.context_limit = self._own_engine(options.model, ctx)
        self.last_replies: list[Optional[str]] = []  # the last call's replies (None: not asked)
        self._warned = False

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
        """The question as the judge's prompt: one user turn in its chat template, else as is."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            return chat_ids(tok, [{"role": "user", "content": question}], add_generation_prompt=True)
        return plain_ids(tok, question)

    def __call__(self, prompts: list[str], completions: list[str], gold: Optional[list] = None,
                 **_) -> list[Optional[float]]:
        golds = gold if gold is not None else [None] * len(completions)
        asked, ids = [], []
        budget = self.context_limit - self.sampling.max_new_tokens if self.context_limit is not None else None
        for i, (p, c, g) in enumerate(zip(prompts, completions, golds)):
            question = self.question(p, c, g)
            if question is None:
                continue
            tokens = self.encode(question)
            if budget is not None and len(tokens) > budget:
                continue
            asked.append(i)
            ids.append(tokens)
        seeds = [(zlib.crc32(bytes(str(t), "utf-8")) + 1_000_003 * self.seed) % 2**31 for t in ids]
        # Every rank asks, with no questions where it has none: a collective under FSDP2 / TP.
        batch = self.generate(ids, n=1, seeds=seeds, sampling=self.sampling)
        replies = self.tokenizer.batch_decode(batch.response_lists(), skip_special_tokens=True) if ids else []
        out: list[Optional[float]] = [None] * len(completions)
        self.last_replies = [None] * len(completions)
        for i, reply in zip(asked, replies):
            self.last_replies[i] = reply
            out[i] = self.parse(reply)
            if out[i] is None and not self._warned:
                self._warned = True
                logger.warning("%s: a reply did not parse, so its response is unscorable (counted in "
                               "train/reward_none); later ones are not logged. The reply: %r", self.name, reply[:200])
        return out

    def close(self) -> None:
        self._model = None
