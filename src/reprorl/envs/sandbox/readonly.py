"""The host's filesystems read-only in a sandbox's view: only its work directory and its private
scratch directories can be written.

Permission bits alone leave every world-writable host directory (`/run/lock`, a shared `777` folder,
wherever it is) open to every sandbox uid in turn, a channel from one episode to a later one. In the
sandbox's own mount namespace every other mount is bound read-only, each keeping its own nosuid,
nodev and noexec flags; device files still work (writing to `/dev/null` modifies no filesystem).
"""

# Plain os calls, as in mounts.py: this runs in every freshly forked sandbox process.
# ruff: noqa: PTH112

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from reprorl.envs.sandbox.mounts import MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY, MS_REMOUNT, mount

MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
_KEPT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}
_ESCAPE = re.compile(r"\\([0-7]{3})")


def mount_points() -> list[tuple[str, str]]:
    """Every mount point of this namespace with its per-mount options (comma-separated), from
    /proc/self/mountinfo. Split no further than needed: with a pool's sandboxes running, the host has
    a mount per sandbox, and every sandbox reads them all."""
    with open("/proc/self/mountinfo") as handle:  # noqa: PTH123
        return parse_mountinfo(handle)


def parse_mountinfo(lines: Iterable[str]) -> list[tuple[str, str]]:
    found = []
    for line in lines:
        fields = line.split(" ", 6)
        if len(fields) < 6:
            continue
        point = fields[4]
        if "\\" in point:  # the kernel writes space, tab, newline and backslash as octal escapes
            point = _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), point)
        found.append((point, fields[5]))
    return found


# Hidden outright, under an empty read-only tmpfs: host daemons listen on sockets here, and a socket
# can be connected to even on a read-only mount.
HIDDEN_DIRS = ("/run",)


def read_only_host(writable: list[str]) -> str:
    """Hide `HIDDEN_DIRS` and bind every other mount read-only but those at or under `writable`;
    returns what was achieved, for `isolation["host_fs"]`: "read_only", or how many mounts stayed
    writable."""
    kept_real = [os.path.realpath(p) for p in writable]
    for hidden in HIDDEN_DIRS:
        real = os.path.realpath(hidden)
        inside = any(k == real or k.startswith(real + "/") for k in kept_real)
        if os.path.isdir(real) and not inside:
            mount(
                "tmpfs",
                real,
                "tmpfs",
                MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
                "size=4096,nr_inodes=16,mode=0755",
            )
    for path in writable:
        if os.path.isdir(path) and not os.path.ismount(path):
            mount(path, path, None, MS_BIND, None)  # a mount of its own, so it can stay writable
    kept = tuple(os.path.realpath(p) for p in writable)
    under_kept = tuple(k + "/" for k in kept)
    refused = 0
    seen: set[str] = set()
    for point, listed in mount_points():
        if point in seen or point in kept or point.startswith(under_kept):
            continue
        options = set(listed.split(","))
        if "ro" in options:
            continue
        seen.add(point)
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for name, flag in _KEPT_FLAGS.items():
            if name in options:
                flags |= flag
        try:
            mount(None, point, None, flags, None)
        except OSError:
            refused += 1  # e.g. a mount hidden under another; what it holds is then out of reach anyway
    return "read_only" if refused == 0 else f"writable ({refused} mounts refused read-only)"
