"""Policies: built-in tiny models and loading pretrained ones."""
from ibpo_lit.models.loading import BUILTIN_MODELS, disable_dropout, load_policy, load_tokenizer
from ibpo_lit.models.tiny import build_tiny_model, build_tiny_tokenizer

__all__ = [
    "BUILTIN_MODELS",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "disable_dropout",
    "load_policy",
    "load_tokenizer",
]
