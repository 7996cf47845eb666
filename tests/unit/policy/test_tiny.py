"""The tiny test model and its tokenizer: deterministic from a seed, ChatML, a drop-in for the real model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from reprorl.actions import CLOSE, OPEN, parse_action
from reprorl.errors import UserInputError
from reprorl.policy import (
    LoadedModel,
    TinyModelConfig,
    build_tokenizer,
    load_base,
    save_model,
    tensors_hash,
    text_hash,
    tiny_model,
)
from reprorl.policy.tiny_tokenizer import CHAT_TEMPLATE

CONVERSATION = [
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "What is 17 * 23?"},
    {
        "role": "assistant",
        "content": f'{OPEN}{{"name": "calc", "arguments": {{"expression": "17 * 23"}}}}{CLOSE}',
    },
    {"role": "tool", "content": "391"},
]
RENDERED = (
    "<|im_start|>system\nYou are a calculator agent.<|im_end|>\n"
    "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>{"name": "calc", "arguments": {"expression": "17 * 23"}}'
    "</tool_call><|im_end|>\n"
    "<|im_start|>tool\n391<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_same_seed_gives_the_same_hash_and_bit_identical_weights(tiny: LoadedModel) -> None:
    again = tiny_model(0)
    assert again.base_hash == tiny.base_hash
    assert tensors_hash(again.model.state_dict()) == tensors_hash(tiny.model.state_dict())


def test_another_seed_gives_other_weights_and_another_hash(tiny: LoadedModel) -> None:
    other = tiny_model(1)
    assert other.base_hash != tiny.base_hash
    assert tensors_hash(other.model.state_dict()) != tensors_hash(tiny.model.state_dict())
    # The seed only draws weights: the tokenizer and template are the same for every seed.
    assert other.tokenizer.backend_tokenizer.to_str() == tiny.tokenizer.backend_tokenizer.to_str()
    assert other.chat_template_hash == tiny.chat_template_hash


def test_building_leaves_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    tiny_model(3)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_size_and_shape() -> None:
    loaded = tiny_model(0)
    assert 1_000_000 <= loaded.n_params <= 5_000_000
    assert loaded.model.config.model_type == "llama"
    assert loaded.model.config.vocab_size == len(loaded.tokenizer)
    assert loaded.model.training is False
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert loaded.chat_template_hash == text_hash(CHAT_TEMPLATE)
    assert loaded.path is None


def test_forward_pass_shape(tiny: LoadedModel) -> None:
    ids = torch.randint(0, len(tiny.tokenizer), (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = tiny.model(input_ids=ids).logits
    assert logits.shape == (2, 64, len(tiny.tokenizer))
    assert torch.isfinite(logits).all()


def test_config_refuses_unknown_fields_and_is_frozen() -> None:
    with pytest.raises(ValidationError):
        TinyModelConfig(hidden=64)  # type: ignore[call-arg]
    config = TinyModelConfig()
    with pytest.raises(ValidationError):
        config.hidden_size = 8  # type: ignore[misc]


def test_a_config_change_changes_the_hash(tiny: LoadedModel) -> None:
    smaller = tiny_model(0, TinyModelConfig(num_hidden_layers=2))
    assert smaller.base_hash != tiny.base_hash
    assert smaller.n_params < tiny.n_params


def test_tokenizer_builds_identically() -> None:
    assert build_tokenizer().backend_tokenizer.to_str() == build_tokenizer().backend_tokenizer.to_str()


@pytest.mark.parametrize(
    "text",
    [
        "What is 17 * 23?",
        "  leading and trailing spaces  ",
        "tabs\tand\nnewlines\r\n and  double  spaces",
        "ünïcödé, 漢字, emoji 😀 and a zero width\u200bjoiner",
        f'{OPEN}{{"name": "calc", "arguments": {{"expression": "1+1"}}}}{CLOSE}',
        f"{OPEN}{OPEN}nested{CLOSE} <|im_start|>user\nhi<|im_end|>",
        "",
    ],
)
def test_tokenizer_round_trips_text(tiny: LoadedModel, text: str) -> None:
    ids = tiny.tokenizer.encode(text)
    assert tiny.tokenizer.decode(ids) == text


def test_special_tokens_match_smollm2_and_tool_tags_are_single_tokens(tiny: LoadedModel) -> None:
    tok = tiny.tokenizer
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert tiny.model.config.eos_token_id == 2
    for tag in (OPEN, CLOSE):
        assert len(tok.encode(tag)) == 1
    # Plain text gets no token in front of it, as with SmolLM2.
    assert tok.decode(tok.encode("hi")) == "hi"
    assert tok.encode("hi")[0] not in tok.all_special_ids
    # Decoding for the action parser drops turn markers but keeps the tool-call tags.
    reply = tok.encode(CONVERSATION[2]["content"] + "<|im_end|>")
    text = tok.decode(reply, skip_special_tokens=True)
    assert text == CONVERSATION[2]["content"]
    assert [c.name for c in parse_action(text).tool_calls] == ["calc"]


def test_chat_template_renders_every_role_and_the_generation_prompt(tiny: LoadedModel) -> None:
    rendered = tiny.tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False)
    assert rendered == RENDERED
    ids = tiny.tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"]) if not isinstance(ids, list) else ids
    assert ids == tiny.tokenizer.encode(RENDERED)
    assert tiny.tokenizer.decode(ids) == RENDERED
    without = tiny.tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=False, tokenize=False)
    assert without == RENDERED.removesuffix("<|im_start|>assistant\n")


def test_saved_folder_loads_back_identically(tiny: LoadedModel, tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    assert save_model(tiny.model, tiny.tokenizer, folder) == tiny.base_hash
    loaded = load_base(folder)
    assert (loaded.base_hash, loaded.chat_template_hash) == (tiny.base_hash, tiny.chat_template_hash)
    assert loaded.n_params == tiny.n_params
    assert loaded.path == folder
    ids = torch.tensor([tiny.tokenizer.encode(RENDERED)])
    with torch.no_grad():
        assert torch.equal(loaded.model(input_ids=ids).logits, tiny.model(input_ids=ids).logits)
    assert loaded.tokenizer.encode(RENDERED) == tiny.tokenizer.encode(RENDERED)
    assert loaded.tokenizer.chat_template == tiny.tokenizer.chat_template


def test_save_refuses_a_folder_that_is_not_empty(tiny: LoadedModel, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(UserInputError, match="not empty"):
        save_model(tiny.model, tiny.tokenizer, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_greedy_generation_is_repeatable(tiny: LoadedModel) -> None:
    prompt = tiny.tokenizer.apply_chat_template(
        CONVERSATION[:2], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    runs = [
        tiny.model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=2) for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])
    assert runs[0].shape[1] > prompt["input_ids"].shape[1]
