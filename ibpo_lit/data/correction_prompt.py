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
"""
from __future__ import annotations

import math
from typing import Optional

DEFAULT_TEMPLATE = (
    "You are given two candidate solutions to the same problem. Compare them step by step, "
    "identify any inconsistencies or errors, and then produce a corrected solution and final answer."
)
DEFAULT_ANSWER_INSTRUCTION = "End with the final answer in the format the problem asks for."
# Code prompts (``Prompt.task == "code"``): the same comparison, with both candidates shown as
# code blocks (extracted from the responses) and the correction asked for as one.
DEFAULT_CODE_TEMPLATE = (
    "You are given two candidate Python solutions to the same programming problem. Compare them step "
    "by step, identify any bugs or inconsistencies, and then write a corrected solution in a single "
    "```python code block."
)
# ``reference: none`` (k = 1): the same wording, adapted to a single candidate.
DEFAULT_SELF_REVISION_TEMPLATE = (
    "You are given a candidate solution to a problem. Check it step by step, identify any errors, "
    "and then produce a corrected solution and final answer."
)
DEFAULT_SELF_REVISION_CODE_TEMPLATE = (
    "You are given a candidate Python solution to a programming problem. Check it step by step, "
    "identify any bugs, and then write a corrected solution in a single ```python code block."
)


class CorrectionPrompt:
    """Renders correction prompts with the given wording (defaults: the ones above).

    ``on_long_prompt``: ``truncate`` or ``skip`` (see the module docstring).
    """

    def __init__(self, template: str = DEFAULT_TEMPLATE, code_template: str = DEFAULT_CODE_TEMPLATE,
                 answer_instruction: Optional[str] = None,
                 self_revision_template: str = DEFAULT_SELF_REVISION_TEMPLATE,
                 self_revision_code_template: str = DEFAULT_SELF_REVISION_CODE_TEMPLATE,
                 on_long_prompt: str = "truncate") -> None:
        self.template, self.code_template = template, code_template
        self.answer_instruction = answer_instruction
        self.self_revision_template, self.self_revision_code_template = self_revision_template, self_revision_code_template
        self.on_long_prompt = on_long_prompt

    @classmethod
    def from_config(cls, cfg) -> CorrectionPrompt:
        """From an ``IBPOConfig`` (its wording fields)."""
        return cls(cfg.template, cfg.code_template, cfg.answer_instruction, cfg.self_revision_template,
                   cfg.self_revision_code_template, cfg.on_long_prompt)

    def text(self, problem: str, attempt: str, reference: Optional[str], instruction: Optional[str],
             task: str = "math") -> str:
        """The user message of ``x~ = (x; y_i, y_ref)``, or of ``(x; y_i)`` when ``reference``
        is None (the self-revision prompt of ``reference: none``)."""
        if task == "code":
            from ibpo_lit.rewards.code import extract_code

            def block(text: str) -> str:
                return f"```python\n{extract_code(text).rstrip()}\n```"

            if reference is None:
                return f"{self.self_revision_code_template}\n\nProblem:\n{problem}\n\nCandidate solution:\n{block(attempt)}"
            return (
                f"{self.code_template}\n\nProblem:\n{problem}\n\n"
                f"Candidate solution 1:\n{block(attempt)}\n\n"
                f"Candidate solution 2:\n{block(reference)}"
            )
        answer = self.answer_instruction or instruction or DEFAULT_ANSWER_INSTRUCTION
        if reference is None:
            return f"{self.self_revision_template}\n\nProblem:\n{problem}\n\nCandidate solution:\n{attempt}\n\n{answer}"
        return (
            f"{self.template}\n\nProblem:\n{problem}\n\n"
            f"Candidate solution 1:\n{attempt}\n\nCandidate solution 2:\n{reference}\n\n{answer}"
        )

    def ids(self, tokenizer, prompt, attempt: str, reference: Optional[str]) -> list[int]:
        """Token ids of the correction prompt, through the chat template when the tokenizer has one."""
        text = self.text(prompt.problem, attempt, reference, prompt.meta.get("instruction"), task=prompt.task)
        if getattr(tokenizer, "chat_template", None):
            messages = []
            if prompt.meta.get("system_prompt"):
                messages.append({"role": "system", "content": prompt.meta["system_prompt"]})
            messages.append({"role": "user", "content": text})
            # The training prompt's template options (Qwen3's enable_thinking: false) hold here too.
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                 **prompt.meta.get("chat_template_kwargs", {}))
            return tokenizer(text, add_special_tokens=False).input_ids
        return tokenizer(text).input_ids

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
        lengths = [len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts]
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
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if drop <= 0:
        return text
    if drop >= len(ids):
        return f"[... {len(ids)} tokens omitted ...]"
    head = (len(ids) - drop) // 2
    tail = len(ids) - drop - head
    return (
        tokenizer.decode(ids[:head]) + f"\n[... {drop} tokens omitted ...]\n" + tokenizer.decode(ids[len(ids) - tail :])
    )
