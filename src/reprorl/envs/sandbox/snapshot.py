"""Snapshots: a read-only copy of a sandbox's `work/` made without ever reading as root.

The copy is a tar stream between two processes. The reader runs as the sandbox's own uid, so
the snapshot can only contain what the sandbox could read itself (a symlink to /etc/shadow stays
a link, a hard link to a root-only file cannot be read). The writer runs as root and extracts
into a staging directory only root can enter, with tarfile's `data` filter (no absolute paths,
no links leaving the tree, no devices, no setuid bits); members the filter refuses are skipped.
The result is owned by root and readable by the sandbox's group, so the sandbox can read but not
change it, and only then renamed into place.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

from reprorl.envs.sandbox import confine
from reprorl.envs.sandbox.layout import remove_tree


def take(message: dict[str, Any]) -> str | None:
    """Copy `src` to `dst` (replacing it); runs in a helper forked by the zygote. Returns an error or None."""
    src, dst = Path(message["src"]), Path(message["dst"])
    uid, gid = message["uid"], message["gid"]
    staging = dst.with_name(dst.name + ".new")
    remove_tree(staging)
    staging.mkdir(mode=0o700)
    read_end, write_end = os.pipe()
    reader = os.fork()
    if reader == 0:
        code = 1
        try:
            os.close(read_end)
            os.closerange(3, write_end)
            os.closerange(write_end + 1, 1 << 20)
            if uid is not None:
                confine.drop_to(uid, gid)
                confine.prctl(confine.PR_SET_NO_NEW_PRIVS, 1)
            with os.fdopen(write_end, "wb") as out, tarfile.open(fileobj=out, mode="w|") as tar:
                _archive(tar, src)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            tar.extractall(staging, filter=_skip_unsafe)
    finally:
        _, status = os.waitpid(reader, 0)
    if status != 0:
        remove_tree(staging)
        return f"reading {src} as the sandbox failed (status {status})"
    _seal(staging, gid, privileged=os.geteuid() == 0)
    old = dst.with_name(dst.name + ".old")
    if dst.exists():
        dst.rename(old)
    staging.rename(dst)
    remove_tree(old)
    return None


def _archive(tar: tarfile.TarFile, src: Path) -> None:
    """Add `src` entry by entry, skipping what cannot be read, so one unreadable file cannot stop it."""
    tar.add(src, arcname=".", recursive=False)
    for directory, dirnames, filenames in os.walk(src):
        for name in (*dirnames, *filenames):
            path = Path(directory, name)
            with contextlib.suppress(OSError):
                tar.add(path, arcname=str(path.relative_to(src)), recursive=False)


def _skip_unsafe(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    try:
        return tarfile.data_filter(member, path)
    except tarfile.FilterError:
        return None


def _seal(top: Path, gid: int | None, *, privileged: bool) -> None:
    """Make the tree read-only for the sandbox: root-owned (when we are root) and never writable."""
    for directory, dirnames, filenames in os.walk(top):
        for name in filenames:
            path = Path(directory, name)
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                path.chmod(0o555 if mode & stat.S_IXUSR else 0o444)
        for name in dirnames:
            Path(directory, name).chmod(0o555)
    if privileged and gid is not None:
        os.chown(top, 0, gid)
        top.chmod(0o550)
    else:
        top.chmod(0o555)
