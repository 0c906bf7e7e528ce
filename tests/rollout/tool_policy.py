"""Policies that use the Python tool: tiny-llama (character tokenizer) taught tool-integrated
transcripts in a few seconds. Real weights, tokenizer and sandbox; only the lessons are small.

``tool_policy``: one transcript, learnt by heart (the rollout driver's unit tests).
``arithmetic_tool_policy``: the arithmetic configs' prompts ("What is a + b?", chat template and
instruction as the data module builds them), each answered by a cell that prints ``a + b``, the
tool's turn, then ``#### <sum>``: at temperature 1 it writes cells, sometimes wrong or broken
ones, and answers after reading the output (the fit tests and the 1-vs-2-process test)."""
from __future__ import annotations

from pathlib import Path

import torch

from ibpo_lit.data.prompt_builder import PromptBuilder
from ibpo_lit.models.loading import load_policy
from ibpo_lit.rollout.tools import ToolConfig

PROMPT = "Q: 6*7?\n"
TEMPLATE = ToolConfig().output_template
CELLS = ("x = 6*7\n", "print(x)\n")  # the second reads the first's state
CODES = tuple("```python\n" + cell + "```" for cell in CELLS)
OUTPUTS = (TEMPLATE.format(output=""), TEMPLATE.format(output="42\n"))  # what the sandbox's turns will read
ANSWER = "A: 42"
TRANSCRIPT = CODES[0] + OUTPUTS[0] + CODES[1] + OUTPUTS[1] + ANSWER
INSTRUCTION = "Give the final answer after ####."


def teach(model, tokenizer, lessons: list[tuple[list[int], str]], steps: int, seed: int = 0, lr: float = 1e-2) -> None:
    """Fit ``model`` to the responses (text, EOS appended) of ``lessons`` [(prompt ids, response)]."""
    rows = [(p, p + tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]) for p, r in lessons]
    width = max(len(ids) for _, ids in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (prompt, full) in enumerate(rows):
        ids[i, : len(full)] = torch.tensor(full)
        labels[i, len(prompt): len(full)] = torch.tensor(full[len(prompt):])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(steps):
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if loss.item() < 1e-3:
                break
    model.eval()


def tool_policy(steps: int = 300, seed: int = 0):
    """(model, tokenizer, prompt ids): the model writes ``TRANSCRIPT`` (two cells, each followed
    by the tool's turn, then ``ANSWER``) and EOS, near-deterministically at temperature <= 1."""
    model, tokenizer = load_policy("tiny-llama", seed=seed)
    prompt = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    teach(model, tokenizer, [(prompt, TRANSCRIPT)], steps, seed)
    return model, tokenizer, prompt


def arithmetic_tool_policy(folder: Path, steps: int = 120, seed: int = 0, max_operand: int = 3) -> Path:
    """A tiny-llama taught tool use on "What is a + b?" (a, b <= ``max_operand``), saved to
    ``folder`` (``model.model: <folder>``)."""
    model, tokenizer = load_policy("tiny-llama", seed=seed)
    builder = PromptBuilder(tokenizer, instruction=INSTRUCTION)
    lessons = []
    for a in range(max_operand + 1):
        for b in range(max_operand + 1):
            output = ToolConfig().output_template.format(output=f"{a + b}\n")
            lessons.append((builder.encode(f"What is {a} + {b}?"),
                            f"```python\nprint({a} + {b})\n```{output}#### {a + b}"))
    teach(model, tokenizer, lessons, steps, seed, lr=3e-3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
