"""The content-addressed blob store: round trips, addressing, corruption detection, housekeeping."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from reprorl.errors import ArtifactNotFoundError, IntegrityError, StoreError, UserInputError
from reprorl.hashing import canonical_json
from reprorl.store import ContentStore, Store
from reprorl.store.blobs import TREE_FORMAT


def addr(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def blobs(tmp_path: Path) -> ContentStore:
    return ContentStore(tmp_path / "home")


def make_tree(root: Path, files: dict[str, bytes], executable: tuple[str, ...] = ()) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o755 if rel in executable else 0o644)
    return root


TREE = {
    "README.md": b"# model\n",
    "weights/a.bin": bytes(range(256)) * 40,
    "bin/run.sh": b"#!/bin/sh\n",
    "e": b"",
}


def flip_byte(path: Path, where: str) -> None:
    """Invert one byte of a stored (read-only) object in place."""
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    index = {"first": 0, "middle": len(data) // 2, "last": len(data) - 1}[where]
    data[index] ^= 0xFF
    with path.open("r+b") as handle:
        handle.write(data)
    path.chmod(0o444)


# -- writing and reading back ----------------------------------------------------------------------


def test_put_bytes_round_trip_and_layout(blobs: ContentStore) -> None:
    data = b"hello, store\n" * 1000
    address = blobs.put_bytes(data)
    assert address == addr(data)
    digest = address.removeprefix("sha256:")
    obj = blobs.objects / digest[:2] / digest[2:]
    assert obj.is_file()
    assert stat.S_IMODE(obj.stat().st_mode) == 0o444  # objects are read-only
    assert blobs.has(address)
    assert blobs.get_bytes(address) == data
    blobs.verify(address)
    assert blobs.path_of(address).read_bytes() == data
    assert list(blobs.addresses()) == [address]
    assert list(blobs.tmp.iterdir()) == []  # nothing left behind in tmp/


def test_same_content_same_address(blobs: ContentStore, tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 17)  # spans several read chunks
    src = tmp_path / "blob.bin"
    src.write_bytes(data)
    a = blobs.put_bytes(data)
    b = blobs.put_file(src)
    c = blobs.put_bytes(data)
    assert a == b == c == addr(data)
    assert list(blobs.addresses()) == [a]
    assert blobs.get_bytes(a) == data
    assert blobs.put_bytes(b"") == addr(b"")
    assert blobs.get_bytes(addr(b"")) == b""
    assert blobs.put_bytes(b"other") != a


def test_put_tree_round_trip(blobs: ContentStore, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", TREE, executable=("bin/run.sh",))
    (src / "empty-dir").mkdir()
    address = blobs.put_tree(src)
    assert blobs.is_tree(address)
    assert not blobs.is_tree(addr(TREE["README.md"]))

    manifest = blobs.read_tree(address)
    assert manifest["format"] == TREE_FORMAT
    assert [e["path"] for e in manifest["entries"]] == sorted(TREE)
    by_path = {e["path"]: e for e in manifest["entries"]}
    assert by_path["weights/a.bin"]["hash"] == addr(TREE["weights/a.bin"])
    assert by_path["weights/a.bin"]["size"] == len(TREE["weights/a.bin"])
    assert by_path["bin/run.sh"]["exec"] is True
    assert by_path["README.md"]["exec"] is False

    out = blobs.export_tree(address, tmp_path / "out")
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert got == TREE
    assert os.access(out / "bin/run.sh", os.X_OK)
    assert not (out / "README.md").stat().st_mode & stat.S_IXUSR
    assert [p.name for p in (tmp_path).iterdir() if p.name.startswith(".tmp-")] == []


def test_tree_hash_depends_on_content_names_and_exec_bits(blobs: ContentStore, tmp_path: Path) -> None:
    base = blobs.put_tree(make_tree(tmp_path / "a", TREE, executable=("bin/run.sh",)))
    # Same content elsewhere, written later (different mtimes): same hash.
    time.sleep(0.01)
    assert blobs.put_tree(make_tree(tmp_path / "b", TREE, executable=("bin/run.sh",))) == base

    changed = dict(TREE, **{"weights/a.bin": TREE["weights/a.bin"][:-1] + b"\x00"})
    assert blobs.put_tree(make_tree(tmp_path / "c", changed, executable=("bin/run.sh",))) != base

    renamed = {("README.txt" if k == "README.md" else k): v for k, v in TREE.items()}
    assert blobs.put_tree(make_tree(tmp_path / "d", renamed, executable=("bin/run.sh",))) != base

    no_exec = blobs.put_tree(make_tree(tmp_path / "e", TREE))
    assert no_exec != base
    (tmp_path / "e" / "bin/run.sh").chmod(0o755)
    assert blobs.put_tree(tmp_path / "e") == base


# -- corruption ------------------------------------------------------------------------------------

POSITIONS = ["first", "middle", "last"]


@pytest.mark.parametrize("where", POSITIONS)
def test_flipped_byte_in_file_artifact_is_detected(store: Store, tmp_path: Path, where: str) -> None:
    src = tmp_path / "calc-train.jsonl"
    data = b'{"id": "t1", "prompt": "2+2"}\n' * 50
    src.write_bytes(data)
    version = store.add("calc-train", src)
    assert store.read("calc-train@v1") == data
    flip_byte(store.blobs._path(version.hash), where)

    checks: list[Callable[[], object]] = [
        lambda: store.read("calc-train@v1"),
        lambda: store.blobs.get_bytes(version.hash, label="calc-train@v1"),
        lambda: store.blobs.verify(version.hash, label="calc-train@v1"),
        lambda: store.blobs.path_of(version.hash, label="calc-train@v1"),
        lambda: store.export("calc-train@v1", tmp_path / "exported.jsonl"),
    ]
    for check in checks:
        with pytest.raises(IntegrityError, match="calc-train@v1") as info:
            check()
        assert info.value.artifact == "calc-train@v1"
        assert info.value.expected == version.hash
        assert info.value.actual != version.hash
    assert not (tmp_path / "exported.jsonl").exists()
    assert store.blobs.fsck() == [version.hash]


@pytest.mark.parametrize("where", POSITIONS)
@pytest.mark.parametrize("target", ["member", "manifest"])
def test_flipped_byte_in_tree_artifact_is_detected(
    store: Store, tmp_path: Path, where: str, target: str
) -> None:
    src = make_tree(tmp_path / "model", TREE, executable=("bin/run.sh",))
    version = store.add("policy", src)
    assert version.kind == "tree"
    assert version.size == sum(len(v) for v in TREE.values())
    bad = addr(TREE["weights/a.bin"]) if target == "member" else version.hash
    flip_byte(store.blobs._path(bad), where)

    dest = tmp_path / "out"
    with pytest.raises(IntegrityError, match="policy@v1") as info:
        store.export("policy@v1", dest)
    assert info.value.expected == bad
    with pytest.raises(IntegrityError, match="policy@v1"):
        store.blobs.export_tree(version.hash, tmp_path / "out2", label="policy@v1")
    assert not dest.exists()
    assert not (tmp_path / "out2").exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []  # staging cleaned up
    assert store.blobs.fsck() == [bad]


def test_truncated_and_missing_objects(blobs: ContentStore) -> None:
    keep = blobs.put_bytes(b"keep me")
    cut = blobs.put_bytes(b"0123456789")
    path = blobs._path(cut)
    path.chmod(0o644)
    path.write_bytes(b"01234")
    with pytest.raises(IntegrityError):
        blobs.get_bytes(cut)
    assert blobs.fsck() == [cut]
    assert blobs.get_bytes(keep) == b"keep me"

    path.unlink()
    with pytest.raises(ArtifactNotFoundError):
        blobs.get_bytes(cut, label="gone@v1")
    assert blobs.fsck() == []
    with pytest.raises(UserInputError):
        blobs.get_bytes("sha256:abc")  # not a full hash


def test_export_tree_refuses_paths_outside_the_destination(blobs: ContentStore, tmp_path: Path) -> None:
    payload = blobs.put_bytes(b"pwned")
    for bad_path in ("../evil.txt", "sub/../../evil.txt", "/tmp/reprorl-evil.txt"):
        entries = [{"path": bad_path, "hash": payload, "size": 5, "exec": False}]
        manifest = blobs.put_bytes(canonical_json({"format": TREE_FORMAT, "entries": entries}).encode())
        assert blobs.is_tree(manifest)
        out = tmp_path / "out"
        with pytest.raises(IntegrityError, match="escapes"):
            blobs.export_tree(manifest, out / "dest", label="evil@v1")
        assert not (out / "dest").exists()
        assert not (out / "evil.txt").exists()
        assert not (tmp_path / "evil.txt").exists()
    assert not Path("/tmp/reprorl-evil.txt").exists()


def test_read_tree_refuses_a_plain_blob(blobs: ContentStore) -> None:
    plain = blobs.put_bytes(b'{"format": "something-else"}')
    with pytest.raises(StoreError, match="not a directory manifest"):
        blobs.read_tree(plain)


def test_put_tree_refuses_symlinks(blobs: ContentStore, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "with-file-link", {"a.txt": b"a"})
    (src / "link.txt").symlink_to(src / "a.txt")
    with pytest.raises(UserInputError, match=r"link\.txt"):
        blobs.put_tree(src)

    src2 = make_tree(tmp_path / "with-dir-link", {"sub/a.txt": b"a"})
    (src2 / "alias").symlink_to(src2 / "sub", target_is_directory=True)
    with pytest.raises(UserInputError, match="symbolic link"):
        blobs.put_tree(src2)

    src3 = make_tree(tmp_path / "with-dangling-link", {"a.txt": b"a"})
    (src3 / "z").symlink_to(tmp_path / "does-not-exist")
    with pytest.raises(UserInputError, match="symbolic link"):
        blobs.put_tree(src3)


def test_put_tree_refuses_special_files(blobs: ContentStore, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "with-fifo", {"a.txt": b"a"})
    os.mkfifo(src / "pipe")
    with pytest.raises(UserInputError, match="not a regular file"):
        blobs.put_tree(src)


def test_store_add_refuses_a_folder_with_a_symlink(store: Store, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "model", {"a.txt": b"a"})
    (src / "link").symlink_to(src / "a.txt")
    with pytest.raises(UserInputError):
        store.add("model", src)
    with pytest.raises(ArtifactNotFoundError):
        store.resolve("model@v1")


# -- housekeeping ----------------------------------------------------------------------------------


def test_sweep_tmp_removes_only_old_files(blobs: ContentStore) -> None:
    assert blobs.sweep_tmp() == 0  # no tmp/ yet
    blobs.tmp.mkdir(parents=True)
    old = blobs.tmp / ".tmp-old"
    new = blobs.tmp / ".tmp-new"
    old.write_bytes(b"x" * 100)
    new.write_bytes(b"y")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    kept = blobs.put_bytes(b"real object")

    assert blobs.sweep_tmp() == 1
    assert not old.exists()
    assert new.exists()
    time.sleep(0.01)
    assert blobs.sweep_tmp(older_than_s=0) == 1
    assert list(blobs.tmp.iterdir()) == []
    assert blobs.get_bytes(kept) == b"real object"  # objects are never swept
