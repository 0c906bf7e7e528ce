"""A tiny random causal LM and a character-level ChatML tokenizer, built in code.

They let tests and smoke runs exercise the whole trainer on the CPU in seconds, with no files
and no model hub.

What is covered:
    * ``build_tiny_tokenizer``: one token per character for ``"\\n"`` and printable ASCII
      (32..126), the ChatML special tokens and an unk token. Decoding round-trips ASCII text
      exactly. eos = pad = ``<|im_end|>`` (id 2), as in SmolLM2; no bos.
    * ``build_tiny_model``: a 2-layer Llama (or Qwen3) with random weights, deterministic for a
      seed, float32, sized to the tokenizer.

What is not covered:
    * Anything a trained model knows: these models emit noise. Use them to test plumbing,
      shapes, seeding and numerics, never learning curves beyond "the loss moves".
    * A default system prompt (SmolLM2's template inserts one; ours only renders what it gets).
"""
from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK = "<unk>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, UNK]  # ids 0..3; <|im_end|> = 2 as in SmolLM2
CHARACTERS = ["\n"] + [chr(c) for c in range(32, 127)]  # ids 4..99

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TINY_ARCHS = ("llama", "qwen3")


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level ChatML tokenizer of 100 tokens (4 special + 96 characters)."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    # BPE with no merges and no pre-tokenizer splits text into single characters; characters
    # outside the vocabulary become <unk>. Fuse joins the pieces back with nothing in between.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=IM_END,
        unk_token=UNK,
        bos_token=None,
        additional_special_tokens=[ENDOFTEXT, IM_START],
        clean_up_tokenization_spaces=False,  # it would turn " ." into "." and break round-trips
        model_max_length=2048,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_config(arch: str = "llama", vocab_size: int | None = None):
    """The config of ``build_tiny_model`` (no weights)."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny model arch {arch!r}; expected one of {list(TINY_ARCHS)}")
    if vocab_size is None:
        vocab_size = len(SPECIAL_TOKENS) + len(CHARACTERS)
    eos_id = SPECIAL_TOKENS.index(IM_END)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        # head_dim 32: the smallest head vLLM's CPU attention kernels accept (16 is refused),
        # so the same tiny model runs in both rollout engines.
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        # Character-level prompts are long (MBPP problems run to thousands of characters); the
        # model has no learned positions (RoPE), so its nominal context costs nothing.
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        bos_token_id=None,
        attention_dropout=0.0,
    )
    if arch == "llama":
        config = LlamaConfig(**common)
        config.architectures = ["LlamaForCausalLM"]
    else:
        config = Qwen3Config(**common, head_dim=32)
        config.architectures = ["Qwen3ForCausalLM"]
    return config


def build_tiny_model(seed: int = 0, arch: str = "llama") -> PreTrainedModel:
    """A random 2-layer causal LM (hidden 64, 80k parameters), float32, deterministic per ``seed``.

    The global torch RNG is left untouched: weights come from a forked RNG state.
    """
    config = tiny_config(arch)
    model_cls = LlamaForCausalLM if arch == "llama" else Qwen3ForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).to(torch.float32)
    return model
