"""Turn a problem into a tokenized `Prompt`: chat template, instruction, length policy.

What is covered:
- With a tokenizer that has a chat template: ``[system?, user: problem + "\\n\\n" + instruction]``
  rendered with ``add_generation_prompt=True`` and ``chat_template_kwargs`` (extra variables of the
  template, e.g. Qwen3's ``enable_thinking=False``), and tokenized without extra special tokens (the
  template writes them). Without a chat template: the plain text ``problem\\n\\ninstruction``,
  tokenized with the tokenizer's own special tokens (BOS where it adds one).
- Conversational problems (a record's ``messages``, TRL's format) are rendered as given, with
  two additions: the instruction is appended to the last user message (after a blank line), and
  ``system_prompt`` is put first only when the messages have no system message of their own (the
  data's own wins). A conversation that ends with an assistant message is continued
  (``continue_final_message=True``, no generation prompt), as TRL does. ``meta["system_prompt"]``
  is the system message the prompt used, so the correction prompt asks under the same one.
  Without a chat template: the text form of the conversation (`conversation_text`) with the
  instruction appended; system messages are left out, as ``system_prompt`` is for a string.
- The record's other fields ride along as ``Prompt.columns`` (what reward functions receive).
- The problem is data, and data is text: a record whose problem (or a conversation's message)
  writes ``<|im_end|>\\n<|im_start|>system\\n...`` shows those characters; only the chat template
  writes control tokens (`ibpo_lit.models.untrusted_text`). The same holds for ``system_prompt``
  and ``instruction``: a message's content is text, whoever wrote it.
- Prompts longer than ``max_prompt_tokens``: "skip" (counted), "error", or "truncate", which
  shortens the problem text (keeping its start; in a conversation, the last user message) and
  re-renders, so the template and the generation prompt stay intact; the Prompt's ``problem`` is
  then the shortened text and ``meta["truncated"]`` is True.

What is not covered:
- Few-shot examples; tool calls and other message keys than role and content.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ibpo_lit.data.prompt import Prompt
from ibpo_lit.data.records import conversation_text
from ibpo_lit.models.untrusted_text import chat_ids, plain_ids, text_ids

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

    def encode(self, problem: str, messages: list[dict] | None = None) -> list[int]:
        """The prompt's token ids for ``problem``, or for the conversation ``messages`` when given
        (see the module docstring); every message's content is text, only the chat template
        writes control tokens (`ibpo_lit.models.untrusted_text`)."""
        if messages is not None:
            return self._encode_conversation(messages)
        user = f"{problem}\n\n{self.instruction}" if self.instruction else problem
        if not self.use_chat_template:
            return plain_ids(self.tokenizer, user)
        messages = [{"role": "user", "content": user}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return chat_ids(self.tokenizer, messages, add_generation_prompt=True, **self.chat_template_kwargs)

    def _encode_conversation(self, messages: list[dict]) -> list[int]:
        messages = [dict(m) for m in messages]
        if self.instruction:
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            messages[last_user]["content"] = f"{messages[last_user]['content']}\n\n{self.instruction}"
        if not self.use_chat_template:
            return plain_ids(self.tokenizer, conversation_text(messages))
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        # A final assistant message is a start of the answer to continue (TRL's rule), so the
        # template must neither close it nor open a new assistant turn.
        prefill = messages[-1]["role"] == "assistant"
        kwargs = {"continue_final_message": True} if prefill else {}
        return chat_ids(self.tokenizer, messages, add_generation_prompt=not prefill, **kwargs,
                        **self.chat_template_kwargs)

    def system_prompt_of(self, messages: list[dict] | None) -> str | None:
        """The system message a prompt is rendered with: the conversation's own, else ``system_prompt``."""
        own = next((m["content"] for m in messages or [] if m["role"] == "system"), None)
        return own if own is not None else self.system_prompt

    def build(self, problem: str, gold: str | None, uid: str, columns: dict | None = None,
              messages: list[dict] | None = None) -> Prompt | None:
        """The `Prompt` for one problem, or None if it is too long and the policy is "skip".
        ``columns``: the record's other fields (`Prompt.columns`); ``messages``: a conversational
        problem (`Record.messages`; ``problem`` is then its text form)."""
        ids = self.encode(problem, messages)
        # The correction prompt (callbacks.CorrectionRollouts) reuses the instruction and system
        # prompt; the template variables are kept beside them for it.
        meta: dict = {"instruction": self.instruction, "system_prompt": self.system_prompt_of(messages)}
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
            problem, ids = self._truncate(problem, ids, uid, messages)
            self.stats["truncated_prompts"] += 1
            meta["truncated"] = True
        return Prompt(prompt_ids=ids, problem=problem, gold=gold, task=self.task, uid=uid, meta=meta,
                      columns=dict(columns or {}))

    def _truncate(self, problem: str, ids: list[int], uid: str,
                  messages: list[dict] | None = None) -> tuple[str, list[int]]:
        """``(problem, ids)`` with the problem's text cut (its end) until the prompt fits; in a
        conversation the last user message is cut and ``problem`` is the new text form."""
        if messages is None:
            text, encode = problem, lambda cut: (cut, self.encode(cut))
        else:
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            text = messages[last_user]["content"]

            def encode(cut: str) -> tuple[str, list[int]]:
                shorter = [dict(m, content=cut) if i == last_user else m for i, m in enumerate(messages)]
                return conversation_text(shorter), self.encode("", shorter)
        pieces = text_ids(self.tokenizer, text)
        keep = len(pieces) - (len(ids) - self.max_prompt_tokens)
        while keep > 0:
            cut = self.tokenizer.decode(pieces[:keep], skip_special_tokens=True)
            problem, ids = encode(cut)
            if len(ids) <= self.max_prompt_tokens:
                return problem, ids
            keep -= max(1, len(ids) - self.max_prompt_tokens)
        alone = "the template and instruction" if messages is None else \
            "the template, instruction and the conversation's other messages"
        raise PromptTooLongError(
            f"prompt {uid}: {alone} alone exceed max_prompt_tokens="
            f"{self.max_prompt_tokens}; raise max_prompt_tokens or shorten system_prompt/instruction"
        )
