"""Tokenizers that have the special tokens an attacker would write, made in code (no network).

- `chatml`: the tiny character-level ChatML tokenizer (``ibpo_lit.models.tiny``), with its chat
  template or without one.
- `qwen3_shaped`: a byte-level BPE trained here on a few sentences, with Qwen3's special tokens
  (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``; special), its added tokens that are not
  special (``<think>``, ``</think>``, ``<tool_call>``, ...) and Qwen3's chat template without
  its tool branches: the system turn, the reasoning split of assistant turns (``</think>`` in an
  assistant message's content is moved into a ``<think>`` block) and ``enable_thinking``.
- `with_bos`: the character tokenizer without a chat template, whose post-processor puts a BOS
  (``<|endoftext|>``) before every text, as Llama-2-style tokenizers do.
- `smollm2`: SmolLM2-135M-Instruct's own tokenizer, fetched on first use as
  ``python -m ibpo_lit fetch`` fetches it.
"""
from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ibpo_lit.models.tiny import build_tiny_tokenizer

QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
QWEN3_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# Qwen3's chat template (Qwen/Qwen3-8B's tokenizer_config.json) with the tool branches removed.
QWEN3_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}"
    "{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and message.content is string and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{%- if loop.last or (not loop.last and reasoning_content) %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' "
    "+ content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

_CORPUS = [
    "What is 2+3? The answer is 5.", "You are grading a response to a problem against the reference answer.",
    "Problem:\nCompute 12*3, then add 4.\n\nResponse:\nIt is 40.", "Reply with YES or NO only.",
    "Candidate solution 1:\nThe sum is 7 #### 7\n\nCandidate solution 2:\nso #### 5", "system user assistant",
]


def chatml(chat_template: bool = True) -> PreTrainedTokenizerFast:
    tok = build_tiny_tokenizer()
    if not chat_template:
        tok.chat_template = None
    return tok


def qwen3_shaped() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=QWEN3_SPECIAL, show_progress=False)
    backend.train_from_iterator(_CORPUS * 10, trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_ADDED])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>", "<|vision_start|>", "<|vision_end|>"],
                                  clean_up_tokenization_spaces=False, model_max_length=4096)
    tok.chat_template = QWEN3_TEMPLATE
    return tok


def with_bos() -> PreTrainedTokenizerFast:
    tok = chatml(chat_template=False)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", tok.convert_tokens_to_ids("<|endoftext|>"))])
    return tok


def smollm2():
    """SmolLM2-135M-Instruct's tokenizer, fetched once per machine as the first command fetches it
    (a lock keeps two workers from converting it twice). It used to skip when not fetched yet: on
    a fresh machine these tests then depended on whether test_smollm2_step.py had run first."""
    from ibpo_lit.models.smollm2 import fetch_smollm2

    return AutoTokenizer.from_pretrained(fetch_smollm2())


def control_ids(tokenizer, ids) -> list[int]:
    """The special-token ids among ``ids``, in order (what structures the conversation)."""
    special = set(tokenizer.all_special_ids)
    return [i for i in ids if i in special]
