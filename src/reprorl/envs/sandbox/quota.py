"""The episode's writable space as a filesystem of its own: a tmpfs over the work directory, bounded in
bytes and in inodes, so a tool can fill neither the host's disk nor its inode table.

It is mounted by the pool, in the host's mount namespace and before the sandbox process starts, so
the process inherits it and the verifier reads the same files from the host; it is unmounted before
the sandbox directory is removed. Mounting needs root: without it the work directory stays on the
host disk, bounded per file only (`file_bytes`), and the sandbox's isolation record says so.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from reprorl.envs.sandbox.limits import SandboxLimits
from reprorl.envs.sandbox.mounts import MS_NODEV, MS_NOSUID, mount

MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def bound_work(work: Path, limits: SandboxLimits, uid: int | None, gid: int | None) -> str:
    """Mount the bounded tmpfs on `work`; returns what was achieved, for `isolation["work_quota"]`."""
    if os.geteuid() != 0:
        return "none (needs root)"
    owner = f",uid={uid},gid={gid}" if uid is not None and gid is not None else ""
    options = f"size={limits.work_bytes},nr_inodes={limits.work_inodes},mode=0700{owner}"
    try:
        mount("tmpfs", str(work), "tmpfs", MS_NOSUID | MS_NODEV, options)
    except OSError as exc:
        return f"none ({exc.strerror or exc})"
    return "tmpfs"


def unbound(base: Path) -> None:
    """Unmount the work directory of the sandbox at `base` if it is a mount (lazily: a process that
    still holds a file there keeps only that file)."""
    work = base / "work"
    if os.path.ismount(work) and _libc.umount2(os.fsencode(work), MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"umount {work}: {os.strerror(errno)}")
