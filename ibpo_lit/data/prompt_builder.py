"""Turn a problem into a tokenized `Prompt`: chat template, instruction, length policy.

What is covered:
- With a tokenizer that has a chat template: ``[system?, user: problem + "\\n\\n" + instruction]``
  rendered with ``add_generation_prompt=True`` and ``chat_template_kwargs`` (extra variables of the
  template, e.g. Qwen3's ``enable_thinking=False``), and tokenized without extra special tokens (the
  template writes them). Without a chat template: the plain text ``problem\\n\\ninstruction``,
  tokenized with the tokenizer's own special tokens (BOS where it adds one).
- The record's other fields ride along as ``Prompt.columns`` (what reward functions receive).
- Prompts longer than ``max_prompt_tokens``: "skip" (counted), "error", or "truncate", which
  shortens the problem text (keeping its start) and re-renders, so the template and the generation
  prompt stay intact; the Prompt's ``problem`` is then the shortened text and
  ``meta["truncated"]`` is True.

What is not covered:
- Few-shot examples, multi-turn prompts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ibpo_lit.data.prompt import Prompt

LongPromptPolicy = Literal["truncate", "skip", "error"]
LONG_PROMPT_POLICIES = ("truncate", "skip", "error")


class PromptTooLongError(ValueError):
    pass


@dataclass
class PromptBuilder:
    tokenizer: Any  # a transformers tokenizer
    instruction: str = ""
    system_prompt: str | None = None
    max_prompt_tokens: int = 512
    on_long_prompt: LongPromptPolicy = "skip"
    task: str = "math"
    chat_template_kwargs: dict = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=lambda: {"skipped_long_prompts": 0, "truncated_prompts": 0})

    def __post_init__(self) -> None:
        if self.on_long_prompt not in LONG_PROMPT_POLICIES:
            raise ValueError(f"on_long_prompt must be one of {LONG_PROMPT_POLICIES}, got {self.on_long_prompt!r}")
        self.use_chat_template = bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, problem: str) -> str:
        """The prompt text for ``problem`` (templated when the tokenizer has a chat template)."""
        user = f"{problem}\n\n{self.instruction}" if self.instruction else problem
        if not self.use_chat_template:
            return user
        messages = [{"role": "user", "content": user}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                  **self.chat_template_kwargs)

    def encode(self, problem: str) -> list[int]:
        text = self.render(problem)
        return list(self.tokenizer(text, add_special_tokens=not self.use_chat_template)["input_ids"])

    def build(self, problem: str, gold: str, uid: str, columns: dict | None = None) -> Prompt | None:
        """The `Prompt` for one problem, or None if it is too long and the policy is "skip".
        ``columns``: the record's other fields (`Prompt.columns`)."""
        ids = self.encode(problem)
        # The correction prompt (callbacks.CorrectionRollouts) reuses the instruction and system
        # prompt; the template variables are kept beside them for it.
        meta: dict = {"instruction": self.instruction, "system_prompt": self.system_prompt}
        if self.chat_template_kwargs:
            meta["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        if len(ids) > self.max_prompt_tokens:
            if self.on_long_prompt == "error":
                raise PromptTooLongError(
                    f"prompt {uid} has {len(ids)} tokens > max_prompt_tokens={self.max_prompt_tokens} "
                    "(set on_long_prompt to 'skip' or 'truncate', or raise max_prompt_tokens)"
                )
            if self.on_long_prompt == "skip":
                self.stats["skipped_long_prompts"] += 1
                return None
            problem, ids = self._truncate(problem, ids, uid)
            self.stats["truncated_prompts"] += 1
            meta["truncated"] = True
        return Prompt(prompt_ids=ids, problem=problem, gold=gold, task=self.task, uid=uid, meta=meta,
                      columns=dict(columns or {}))

    def _truncate(self, problem: str, ids: list[int], uid: str) -> tuple[str, list[int]]:
        problem_ids = self.tokenizer(problem, add_special_tokens=False)["input_ids"]
        keep = len(problem_ids) - (len(ids) - self.max_prompt_tokens)
        while keep > 0:
            cut = self.tokenizer.decode(problem_ids[:keep], skip_special_tokens=True)
            ids = self.encode(cut)
            if len(ids) <= self.max_prompt_tokens:
                return cut, ids
            keep -= max(1, len(ids) - self.max_prompt_tokens)
        raise PromptTooLongError(
            f"prompt {uid}: the template and instruction alone exceed max_prompt_tokens="
            f"{self.max_prompt_tokens}; raise max_prompt_tokens or shorten system_prompt/instruction"
        )
