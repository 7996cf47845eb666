"""A sandbox's private view of the filesystem: its own /tmp, /var/tmp, /dev/shm and /proc.

Without it those are shared with the host and with every other sandbox, and uid slots are reused,
so a file one episode leaves in /tmp could be read by a later episode that runs under the same uid,
and /proc would list the host's processes with their command lines. The sandbox process applies
this to itself while still root: a new mount namespace, made private so that nothing it mounts
reaches the host, one size-limited tmpfs behind all three scratch directories, and a procfs of its
own PID namespace. It all vanishes with the namespace's last process, so a sandbox process restarted
after a crash or a timeout starts with empty scratch directories (its work dir is untouched).
"""

# Plain os calls rather than pathlib: this runs in every freshly forked sandbox process, where each
# Python object touched costs a copied page, and pathlib touched enough to double the setup time.
# ruff: noqa: PTH101, PTH102, PTH112, PTH116, PTH120

from __future__ import annotations

import ctypes
import functools
import os
import sys

CLONE_NEWNS = 0x00020000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RDONLY = 0x1
MS_REMOUNT = 0x20

SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
PAGE_BYTES = 4096
MIN_INODES = 256

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


def make_private(sandbox_dir: str, tmp_bytes: int, *, own_pid_namespace: bool) -> str:
    """Give this process private scratch directories and, in its own PID namespace, its own /proc.

    Needs CAP_SYS_ADMIN; `sandbox_dir` (a real path) stays reachable at the same path even when it
    lies under a scratch directory. Returns what was achieved, for `isolation["mounts"]`:
    "private_tmp_proc", "private_tmp", "private_proc" or "shared".
    """
    if _libc.unshare(CLONE_NEWNS) != 0:
        return "shared"
    try:
        # The copied mounts may be in the host's peer groups; until this succeeds, anything
        # mounted here would appear on the host too, so nothing is.
        mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    except OSError:
        return "shared"
    tmp = _private_scratch(sandbox_dir, tmp_bytes)
    _reachable_interpreter(sandbox_dir)
    proc = own_pid_namespace and _private_proc()
    if tmp and proc:
        return "private_tmp_proc"
    if tmp:
        return "private_tmp"
    return "private_proc" if proc else "shared"


@functools.cache
def scratch_dirs() -> tuple[str, ...]:
    """The scratch directories present here, as real paths, each once (/var/tmp may be a link to /tmp).

    Cached, and asked once by the zygote, so that every sandbox it forks inherits the answer.
    """
    found: list[str] = []
    for path in SCRATCH_DIRS:
        real = os.path.realpath(path)
        if real not in found and os.path.isdir(real):
            found.append(real)
    return tuple(found)


def _private_scratch(sandbox_dir: str, tmp_bytes: int) -> bool:
    """Cover every scratch directory with a subdirectory of one fresh tmpfs, so one bound holds for all.

    The tmpfs goes on the first directory, its subdirectories are bound onto the others, and last
    its own subdirectory is bound over the tmpfs's root, which nothing can reach after that.
    """
    targets = scratch_dirs()
    if not targets:
        return True
    covered = any(sandbox_dir.startswith(target + "/") for target in targets)
    # Opened before the tmpfs hides it: the path through /proc/self/fd still leads to it afterwards.
    sandbox_fd = os.open(sandbox_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if covered else -1
    try:
        staging = targets[0]
        # tmpfs counts data pages against size= but not inodes, so empty files need their own bound.
        inodes = max(MIN_INODES, tmp_bytes // PAGE_BYTES)
        options = f"size={tmp_bytes},nr_inodes={inodes},mode=1777"
        try:
            mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, options)
        except OSError:
            return False  # not permitted here (e.g. a security module forbids mounts): nothing changed
        # From here on a failure is not a missing permission but a broken view, which must not run
        # tools: it propagates and the sandbox fails to start.
        subdirs = {target: staging + "/" + target.strip("/").replace("/", "-") for target in targets}
        for subdir in subdirs.values():
            _make_dir(subdir, 0o1777)
        for target in (*targets[1:], staging):
            mount(subdirs[target], target, None, MS_BIND, None)
        if covered:
            _recreate(sandbox_dir, sandbox_fd)
    finally:
        if sandbox_fd >= 0:
            os.close(sandbox_fd)
    return True


@functools.cache
def hidden_interpreter_dirs() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Folders of this interpreter (its prefixes and import path) that a sandbox's own uid could not
    reach, grouped under the highest folder that others may not pass (a Python installed in root's
    0700 home, say): `((top, (dir, ...)), ...)`. Asked once by the zygote, like `scratch_dirs`."""
    wanted = [sys.base_prefix, sys.prefix, sys.exec_prefix, *sys.path]
    found: dict[str, list[str]] = {}
    scratch = scratch_dirs()
    for path in dict.fromkeys(os.path.realpath(p) for p in wanted if p):
        if not os.path.isdir(path) or any(path == d or path.startswith(d + "/") for d in scratch):
            continue  # a scratch dir is the sandbox's own empty tmpfs: what lay there is gone anyway
        top = _first_closed_ancestor(path)
        if top is not None:
            found.setdefault(top, []).append(path)
    out = []
    for top, dirs in found.items():
        # Only the outermost: a prefix already brings its lib/ along.
        outer = [d for d in dirs if not any(d != o and d.startswith(o + "/") for o in dirs)]
        out.append((top, tuple(sorted(outer))))
    return tuple(out)


def _first_closed_ancestor(path: str) -> str | None:
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts)):
        ancestor = "/" + "/".join(parts[:depth])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def _reachable_interpreter(sandbox_dir: str) -> None:
    """Make the interpreter's own files importable under the sandbox's uid, and only them.

    A tool function runs in the pre-imported zygote's copy and needs nothing more, but an agent
    program imports lazily (a framework's `concurrent.futures.thread`, `urllib.request`) and may
    start the interpreter again. Each closed folder above the interpreter is covered by an empty
    tmpfs, into which the interpreter's folders are bound read-only: the sandbox reaches them and
    nothing else that was there."""
    for top, dirs in hidden_interpreter_dirs():
        keep = [*dirs, *([sandbox_dir] if sandbox_dir.startswith(top + "/") else [])]
        fds = [os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for d in keep]
        try:
            try:
                mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=65536,nr_inodes=256,mode=0711")
            except OSError:
                continue  # not permitted here: the view stays as it was, the preloaded modules serve
            for path, fd in zip(keep, fds, strict=True):
                if path == sandbox_dir:
                    _recreate(path, fd)
                    continue
                _make_path(path)
                mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
                mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
        finally:
            for fd in fds:
                os.close(fd)


def _make_path(path: str) -> None:
    missing = [path]
    while not os.path.isdir(os.path.dirname(missing[-1])):
        missing.append(os.path.dirname(missing[-1]))
    for folder in reversed(missing):
        _make_dir(folder, 0o711)


def _recreate(sandbox_dir: str, sandbox_fd: int) -> None:
    """Bind the sandbox's own directory back at its path, the only one of the pool's the sandbox sees here."""
    missing = [sandbox_dir]
    while not os.path.isdir(os.path.dirname(missing[-1])):
        missing.append(os.path.dirname(missing[-1]))
    for path in reversed(missing):
        _make_dir(path, 0o711)  # like the pool root: passable, not listable, root's
    mount(f"/proc/self/fd/{sandbox_fd}", sandbox_dir, None, MS_BIND | MS_REC, None)


def _make_dir(path: str, mode: int) -> None:
    os.mkdir(path)
    os.chmod(path, mode)  # mkdir's mode is filtered by the umask


def _private_proc() -> bool:
    """Mount a procfs of this process's PID namespace on /proc, so it shows only the sandbox's processes."""
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    except OSError:
        # e.g. a container whose own /proc hides parts behind other mounts: the kernel then refuses
        # a fresh one that would reveal them. The host's /proc stays, and isolation says so.
        return False
    return True


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    """mount(2), an OSError naming the target when it fails."""
    if _libc.mount(_encode(source), _encode(target), _encode(fstype), flags, _encode(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def _encode(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)
