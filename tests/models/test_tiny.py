"""The built-in tiny tokenizer and model."""
import string

import pytest
import torch

from ibpo_lit.models.tiny import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_tokenizer_round_trips_ascii_one_token_per_character(tokenizer):
    text = "".join(chr(c) for c in range(32, 127)) + "\n  two  spaces . ,\nend \n"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_tokenizer_vocabulary_and_special_ids(tokenizer):
    # 4 specials (<|endoftext|>, <|im_start|>, <|im_end|>, <unk>) + "\n" + 95 printable = 100
    assert len(tokenizer) == 100
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tokenizer.convert_tokens_to_ids(specials) == [0, 1, 2]
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 2
    assert tokenizer.bos_token is None
    a = tokenizer.convert_tokens_to_ids("a")
    assert tokenizer("<|im_start|>a<|im_end|>")["input_ids"] == [1, a, 2]
    assert tokenizer("é")["input_ids"] == [tokenizer.unk_token_id]
    assert tokenizer.decode([1, 2], skip_special_tokens=True) == ""


def test_chat_template_is_chatml(tokenizer):
    user = [{"role": "user", "content": "hi"}]
    assert (
        tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}] + user
    assert (
        tokenizer.apply_chat_template(with_system, add_generation_prompt=False, tokenize=False)
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    )


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_model_is_deterministic_for_a_seed(arch, tokenizer):
    state = torch.random.get_rng_state()
    a, b, c = build_tiny_model(0, arch), build_tiny_model(0, arch), build_tiny_model(1, arch)
    assert torch.equal(torch.random.get_rng_state(), state), "global RNG must be left alone"
    ids = torch.tensor([tokenizer(string.ascii_letters)["input_ids"]])
    with torch.no_grad():
        la, lb, lc = (m(ids).logits for m in (a, b, c))
    assert torch.equal(la, lb)
    assert not torch.allclose(la, lc)
    assert la.shape == (1, ids.shape[1], len(tokenizer))
    assert a.dtype == torch.float32
    assert a.config.eos_token_id == a.config.pad_token_id == tokenizer.eos_token_id
    assert a.config.tie_word_embeddings


def test_model_rejects_unknown_arch():
    with pytest.raises(ValueError, match="arch"):
        build_tiny_model(arch="gpt2")
