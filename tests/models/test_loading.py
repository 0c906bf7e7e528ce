"""load_policy / load_tokenizer: built-in names, local directories, and the errors."""
import pytest
import torch

from ibpo_lit.models import BUILTIN_MODELS, build_tiny_model, build_tiny_tokenizer
from ibpo_lit.models import load_policy, load_tokenizer
from ibpo_lit.models import loading


def test_builtin_names_build_in_code():
    assert {"tiny-llama", "tiny-qwen3"} <= set(BUILTIN_MODELS)
    model, tokenizer = load_policy("tiny-llama", seed=3)
    reference = build_tiny_model(3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters()))
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 2
    assert load_tokenizer("tiny-qwen3").get_vocab() == tokenizer.get_vocab()


def test_dtype_is_applied_and_checked():
    model, _ = load_policy("tiny-llama", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        load_policy("tiny-llama", dtype="fp8")


@pytest.mark.parametrize("path", ["./no/such/model", "/no/such/model", "~/no-such-model-dir"])
def test_missing_local_path_names_it(path):
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        load_policy(path)
    assert path in str(info.value)
    with pytest.raises(FileNotFoundError):
        load_tokenizer(path)


def test_unreachable_hub_id_says_what_to_do(monkeypatch):
    # Without this patch the real hub client retries for ~45 s before failing offline.
    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", offline)
    expected = "could not load model 'org/model' from the Hugging Face hub"
    with pytest.raises(OSError, match=expected) as info:
        load_policy("org/model")
    assert "couldn't connect" in str(info.value) and "tiny-llama" in str(info.value)


def test_saved_model_reloads_through_from_pretrained(tmp_path):
    model, tokenizer = build_tiny_model(5), build_tiny_tokenizer()
    model.config.attention_dropout = 0.1  # a checkpoint trained with dropout
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    loaded, loaded_tokenizer = load_policy(str(tmp_path))
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert loaded.config.attention_dropout == 0.0, "dropout must be off for RL"
    text = "<|im_start|>user\n2+2?<|im_end|>\n"
    assert loaded_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded_tokenizer.pad_token_id == loaded_tokenizer.eos_token_id == 2
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert load_tokenizer(str(tmp_path)).get_vocab() == tokenizer.get_vocab()


def test_pad_token_falls_back_to_eos():
    tokenizer = build_tiny_tokenizer()
    tokenizer.pad_token = None
    loading._ensure_pad_token(tokenizer)
    assert tokenizer.pad_token == tokenizer.eos_token


def test_disable_dropout_zeroes_config_and_modules():
    model = build_tiny_model()
    model.config.attention_dropout = 0.3
    model.model.extra = torch.nn.Dropout(0.5)
    loading.disable_dropout(model)
    assert model.config.attention_dropout == 0.0 and model.model.extra.p == 0.0
