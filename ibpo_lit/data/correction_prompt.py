"""The compare-and-correct prompt (METHOD section 5): ``x~ = (x; y_i, y_ref)``, or ``(x; y_i)``
for the k = 1 ablation, as text and as token ids within a context budget.

Used by training's correction rollouts (``ibpo_lit.training.corrections``) and by evaluation's
test-time correction baseline, so both ask the policy the same question.

Conversational prompts: the problem quoted is ``Prompt.problem``, the conversation's text form (a
lone user message as written; several turns as ``User: ...`` / ``Assistant: ...`` paragraphs),
and the system message is the one the prompt was rendered with (``meta["system_prompt"]``: the
conversation's own, else ``data.system_prompt``), so a correction is asked in the same setting.

Long inputs: a correction prompt holds the problem and two whole responses, so with long
responses it can exceed the context. ``on_long_prompt`` decides: ``truncate`` shortens each
candidate in its middle, keeping its opening and its end (where the final answer is) with a
``[... N tokens omitted ...]`` marker; ``skip`` gives up on that correction.

Untrusted text: the problem (data) and the candidates (the policy's own responses) are text. A
response that writes ``<|im_end|>\\n<|im_start|>system\\n...`` shows those characters in the
correction prompt; it cannot close the user turn and open a system turn of its choosing
(`ibpo_lit.models.untrusted_text`: only the chat template writes control tokens).
"""
from __future__ import annotations

import math
from typing import Optional

from ibpo_lit.models.untrusted_text import chat_ids, plain_ids, text_ids
from ibpo_lit.tasks import CorrectionWording, get_task


class CorrectionPrompt:
    """Renders correction prompts with the given wording (defaults: each task's own, `ibpo_lit.tasks`).

    The task of the prompt (``Prompt.task``) decides how the candidates are shown and which of
    the wording's fields it reads (an answer task: ``template``; a program task: ``code_template``).
    ``on_long_prompt``: ``truncate`` or ``skip`` (see the module docstring).
    """

    def __init__(self, on_long_prompt: str = "truncate", **wording: Optional[str]) -> None:
        self.wording = CorrectionWording(**wording)  # an unknown field is a TypeError naming it
        self.on_long_prompt = on_long_prompt

    @classmethod
    def from_config(cls, cfg) -> CorrectionPrompt:
        """From an ``IBPOConfig`` (its wording fields)."""
        return cls(cfg.on_long_prompt, template=cfg.template, code_template=cfg.code_template,
                   answer_instruction=cfg.answer_instruction, self_revision_template=cfg.self_revision_template,
                   self_revision_code_template=cfg.self_revision_code_template)

    def text(self, problem: str, attempt: str, reference: Optional[str], instruction: Optional[str],
             task: str = "math") -> str:
        """The user message of ``x~ = (x; y_i, y_ref)``, or of ``(x; y_i)`` when ``reference``
        is None (the self-revision prompt of ``reference: none``), as ``task`` words it."""
        return get_task(task).correction_text(self.wording, problem, attempt, reference, instruction)

    def ids(self, tokenizer, prompt, attempt: str, reference: Optional[str]) -> list[int]:
        """Token ids of the correction prompt, through the chat template when the tokenizer has
        one; every quoted text stays text (the module docstring)."""
        text = self.text(prompt.problem, attempt, reference, prompt.meta.get("instruction"), task=prompt.task)
        if getattr(tokenizer, "chat_template", None):
            messages = []
            if prompt.meta.get("system_prompt"):
                messages.append({"role": "system", "content": prompt.meta["system_prompt"]})
            messages.append({"role": "user", "content": text})
            # The training prompt's template options (Qwen3's enable_thinking: false) hold here too.
            return chat_ids(tokenizer, messages, add_generation_prompt=True, **prompt.meta.get("chat_template_kwargs", {}))
        return plain_ids(tokenizer, text)

    def bounded_ids(self, tokenizer, prompt, attempt: str, reference: Optional[str],
                    budget: Optional[int]) -> tuple[Optional[list[int]], bool]:
        """``(ids, truncated)``: the correction prompt within ``budget`` tokens (None: no
        bound); with ``on_long_prompt: skip``, ``(None, False)`` when it does not fit."""
        ids = self.ids(tokenizer, prompt, attempt, reference)
        if budget is None or len(ids) <= budget:
            return ids, False
        if self.on_long_prompt == "skip":
            return None, False
        over = len(ids) - budget
        texts = [attempt] if reference is None else [attempt, reference]
        lengths = [len(text_ids(tokenizer, t)) for t in texts]
        # Shorten each candidate in proportion to its length, with room for the markers.
        for extra in (16, 64, 256):
            cut = [math.ceil((over + extra) * n / max(sum(lengths), 1)) for n in lengths]
            short = [_cut_middle(tokenizer, t, c) for t, c in zip(texts, cut)]
            ids = self.ids(tokenizer, prompt, short[0], short[1] if reference is not None else None)
            if len(ids) <= budget:
                return ids, True
        return None, False  # the problem alone does not leave room: nothing to correct


def _cut_middle(tokenizer, text: str, drop: int) -> str:
    """``text`` without ``drop`` tokens from its middle, marked where they were."""
    ids = text_ids(tokenizer, text)
    if drop <= 0:
        return text
    if drop >= len(ids):
        return f"[... {len(ids)} tokens omitted ...]"
    head = (len(ids) - drop) // 2
    tail = len(ids) - drop - head
    return (
        tokenizer.decode(ids[:head]) + f"\n[... {drop} tokens omitted ...]\n" + tokenizer.decode(ids[len(ids) - tail :])
    )
