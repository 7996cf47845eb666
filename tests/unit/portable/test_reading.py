"""A hostile bundle is refused before anything is written outside the extraction folder: links,
paths that climb out, members that collide, a record too large to be one, a tar cut short."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from reprorl.portable.reading import BundleError, read_bundle


def tar_of(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                name, data = member
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    ("members", "named", "why"),
    [
        ([link("runs/r/evil", "/etc/passwd")], "runs/r/evil", "not a regular file"),
        ([link("runs/r/hard", "/etc/passwd", tarfile.LNKTYPE)], "runs/r/hard", "not a regular file"),
        ([("../escape.txt", b"x")], "../escape.txt", "leaves the bundle"),
        ([("/abs.txt", b"x")], "/abs.txt", "leaves the bundle"),
        ([("runs/r/a", b"x"), ("runs/r/a/b", b"y")], "runs/r/a/b", "collides"),
        ([("runs/r/x", b"1"), ("runs/r/x", b"2")], "runs/r/x", "appears twice"),
        ([("manifest.json", b"{}"), ("runs/r/late", b"x")], "runs/r/late", "after the manifest"),
    ],
)
def test_a_hostile_member_is_refused_by_name_and_nothing_leaves_the_folder(
    tmp_path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]], named: str, why: str
) -> None:
    bundle = tar_of(tmp_path / "b.tar", members)
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(BundleError) as caught:
        read_bundle(bundle, into=into)
    message = str(caught.value)
    assert named in message and why in message and "\n" not in message
    assert not (tmp_path / "escape.txt").exists() and not Path("/abs.txt").exists()
    assert all(not p.is_symlink() for p in into.rglob("*"))


def test_a_cut_short_or_foreign_file_is_named_as_such(tmp_path: Path) -> None:
    whole = tar_of(tmp_path / "b.tar", [("runs/r/run.json", b"{}" * 4000)])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole.read_bytes()[:1500])
    with pytest.raises(BundleError, match="cut short"):
        read_bundle(cut)
    foreign = tmp_path / "notes.tar"
    foreign.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(BundleError, match="cut short or not a bundle"):
        read_bundle(foreign)
    with pytest.raises(BundleError, match="no such bundle file"):
        read_bundle(tmp_path / "absent.tar")
