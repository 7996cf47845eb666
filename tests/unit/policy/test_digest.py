"""Model hashes agree with the artifact store's, and tensor hashes see every bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reprorl.errors import UserInputError
from reprorl.hashing import HASH_PREFIX, sha256_hex
from reprorl.policy import file_hash, tensors_hash, text_hash, tree_hash
from reprorl.store import Store


def _folder(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}\n')
    (root / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (root / "sub" / "deeper" / "empty").write_bytes(b"")
    script = root / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    return root


def test_folder_hash_is_the_store_address(store: Store, tmp_path: Path) -> None:
    folder = _folder(tmp_path / "model")
    assert tree_hash(folder) == store.blobs.put_tree(folder)


def test_file_hash_is_the_store_address(store: Store, tmp_path: Path) -> None:
    path = _folder(tmp_path / "model") / "sub" / "weights.bin"
    assert file_hash(path) == store.blobs.put_file(path) == HASH_PREFIX + sha256_hex(path.read_bytes())


def test_excluded_files_do_not_count(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "model")
    before = tree_hash(folder)
    (folder / "marker.json").write_text("{}")
    assert tree_hash(folder) != before
    assert tree_hash(folder, exclude=frozenset({"marker.json"})) == before


def test_folder_hash_sees_content_names_and_exec_bits(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "model")
    seen = {tree_hash(folder)}
    (folder / "config.json").write_text('{"a": 2}\n')
    seen.add(tree_hash(folder))
    (folder / "config.json").rename(folder / "config2.json")
    seen.add(tree_hash(folder))
    (folder / "run.sh").chmod(0o644)
    seen.add(tree_hash(folder))
    assert len(seen) == 4


def test_folder_hash_refuses_links_and_non_folders(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "model")
    with pytest.raises(UserInputError, match="not a directory"):
        tree_hash(folder / "config.json")
    (folder / "link").symlink_to(folder / "config.json")
    with pytest.raises(UserInputError, match="not a regular file"):
        tree_hash(folder)


def test_tensor_hash_sees_values_names_dtypes_and_shapes() -> None:
    base = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    variants = [
        base,
        {"w": base["w"].clone().index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(1e-30))},
        {"v": base["w"]},
        {"w": base["w"].to(torch.float64)},
        {"w": base["w"].reshape(3, 2)},
        {"w": base["w"].to(torch.bfloat16)},
    ]
    assert len({tensors_hash(v) for v in variants}) == len(variants)
    assert tensors_hash({"w": base["w"].t().contiguous().t()}) == tensors_hash(base)


def test_text_hash() -> None:
    assert text_hash("é") == HASH_PREFIX + sha256_hex("é".encode())
