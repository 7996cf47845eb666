"""Sandboxes on disk and their uids: the pool root, one directory per sandbox, owner records, reaping.

    <root>/                 mode 0711: sandboxes can pass through but not list it
      sbx-<pid>.<start>.<id>/   root-owned, 0711; named for the pool (pid + start time) that owns it
        work/               the agent-visible root, owned by the sandbox's uid, 0700
        snapshot/           read-only copy of work/ (see snapshot.py), made on request

The owner is in the directory's name rather than in a file beside `work/`: a sandbox costs two new
inodes, not three, and on a filesystem that scans recently freed inodes before reusing one (ext4
without a journal) each new inode cost up to 0.7 ms of a pool's CPU under a steady stream of episodes.

Dedicated uids are machine-wide state, so a uid slot is claimed with an flock on a file under
`/run/reprorl-sandbox-uids/` that every pool shares, whatever its root. A holder marks its slot
dirty while it may have processes under that uid and clean once they are all dead; a slot found
dirty had a holder that died, and the next holder first kills whatever still runs under that uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprorl.envs.sandbox.confine import real_uid, uid_processes
from reprorl.envs.sandbox.errors import SandboxError
from reprorl.envs.sandbox.quota import unbound

ROOT_ENV = "REPRORL_SANDBOX_ROOT"
PREFIX = "sbx-"
LEGACY_OWNER_FILE = "owner.json"  # where sandboxes of earlier versions kept their owner
# A directory whose owner cannot be read is one a pool is still creating, unless it is older than this.
UNOWNED_GRACE_S = 60.0
CLEAN, DIRTY = b"clean", b"dirty"  # of one length: a lock file's state is overwritten in place


def default_root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or Path(tempfile.gettempdir()) / "reprorl-sandboxes")


def default_uid_lock_dir() -> Path:
    run = Path("/run")
    base = run if run.is_dir() and os.access(run, os.W_OK) else Path(tempfile.gettempdir())
    return base / "reprorl-sandbox-uids"


def prepare_root(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    if root.stat().st_uid == os.geteuid():
        root.chmod(0o711)


@dataclass(frozen=True)
class SandboxDirs:
    """The paths of one sandbox."""

    base: Path

    @property
    def work(self) -> Path:
        return self.base / "work"

    @property
    def snapshot(self) -> Path:
        return self.base / "snapshot"


def create_dirs(root: Path, slot: UidSlot | None) -> tuple[str, SandboxDirs]:
    """Make a fresh sandbox directory with a random id (unguessable, so sandboxes cannot find each
    other), named for this process as its owner."""
    sandbox_id = secrets.token_hex(8)
    pid = os.getpid()
    dirs = SandboxDirs(root / f"{PREFIX}{pid}.{_own_start_ticks(pid)}.{sandbox_id}")
    if not root.is_dir():  # a temp cleaner (or an operator) removed it while the pool ran
        prepare_root(root)
    dirs.base.mkdir(mode=0o711)
    dirs.base.chmod(0o711)
    dirs.work.mkdir(mode=0o700)
    if slot is not None:
        os.chown(dirs.work, slot.uid, slot.gid)
    return sandbox_id, dirs


_START_TICKS: dict[int, int] = {}


def _own_start_ticks(pid: int) -> int:
    if pid not in _START_TICKS:  # keyed by pid: a forked process has its own
        _START_TICKS[pid] = process_start_ticks(pid) or 0
    return _START_TICKS[pid]


def sandbox_owner(base: Path) -> dict[str, Any] | None:
    """The owner a sandbox directory names (pid and start time), else what an earlier version's
    owner file says; None when neither can be read."""
    pid, _, rest = base.name.removeprefix(PREFIX).partition(".")
    start, _, sandbox_id = rest.partition(".")
    if pid.isdigit() and start.isdigit() and sandbox_id:
        return {"pid": int(pid), "start": int(start)}
    try:
        record = json.loads((base / LEGACY_OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def remove_sandbox_dir(base: Path) -> None:
    """Remove a sandbox's directory: its work directory's own filesystem unmounted first."""
    unbound(base)
    remove_tree(base)


def remove_tree(path: Path) -> None:
    """Remove a directory tree even where its owner made parts of it unwritable or unreadable, and
    where another process removes parts of it at the same time (two pools reaping one dead pool's
    sandboxes): what is already gone counts as removed."""

    def unlock_and_retry(function: Any, failed: str, exc: Any) -> None:
        if isinstance(exc[1], FileNotFoundError):
            return
        parent = Path(failed).parent
        with contextlib.suppress(OSError):
            parent.chmod(0o700)
        with contextlib.suppress(OSError):
            Path(failed).chmod(0o700)
        with contextlib.suppress(FileNotFoundError):
            function(failed)

    with contextlib.suppress(FileNotFoundError):
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path, onerror=unlock_and_retry)


def process_start_ticks(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (None if it is gone); tells a pid's reuse apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def owner_alive(record: dict[str, Any]) -> bool:
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    start = process_start_ticks(pid)
    return start is not None and start == record.get("start")


@dataclass
class UidSlot:
    """A claimed dedicated uid (and gid of the same number), held by an flock while in use."""

    uid: int
    lock: Path
    fd: int
    needs_purge: bool

    @property
    def gid(self) -> int:
        return self.uid


class UidSlots:
    """Hands out dedicated uids `base .. base+count-1`; never one another holder (any process) has."""

    def __init__(self, base: int, count: int, lock_dir: Path) -> None:
        self.base, self.count, self.lock_dir = base, count, lock_dir
        self._held: set[int] = set()
        self._next = 0

    def acquire(self) -> UidSlot:
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for step in range(self.count):
            index = (self._next + step) % self.count
            uid = self.base + index
            if uid in self._held:
                continue
            slot = try_lock(uid, self.lock_dir / f"{uid}.lock")
            if slot is not None:
                self._held.add(uid)
                self._next = index + 1
                return slot
        raise SandboxError(f"all {self.count} sandbox uids from {self.base} are in use")

    def release(self, slot: UidSlot, *, clean: bool) -> None:
        self._held.discard(slot.uid)
        unlock(slot, clean=clean)


def try_lock(uid: int, lock: Path) -> UidSlot | None:
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    state = os.pread(fd, 16, 0)
    # CLEAN and DIRTY are the same length, so a state is overwritten in place: truncating on every
    # open and close of a sandbox cost a filesystem journal entry each (about a millisecond here).
    if len(state) > len(DIRTY):
        os.ftruncate(fd, 0)  # not a state of ours: start the file over
    os.pwrite(fd, DIRTY, 0)
    # An empty file is a uid no pool has used yet: nothing of ours can be running under it. Only
    # CLEAN vouches for a used one; anything else (DIRTY, or a file not of ours) is purged first.
    return UidSlot(uid=uid, lock=lock, fd=fd, needs_purge=state not in (b"", CLEAN))


def unlock(slot: UidSlot, *, clean: bool) -> None:
    if clean:
        os.pwrite(slot.fd, CLEAN, 0)
    os.close(slot.fd)


def kill_uid_processes(uid: int, deadline_s: float = 10.0) -> bool:
    """SIGKILL every process of `uid` by scanning /proc, until none is left (for use without a zygote).

    Each kill goes through a pidfd opened before the uid is checked, so a pid that died and was
    reused by another process between the scan and the kill is never signalled.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        pids = uid_processes(uid)
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if real_uid(pid) == uid:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(pidfd)
        time.sleep(0.01)


def reap_sandboxes(root: Path | str | None = None, uid_lock_dir: Path | None = None) -> int:
    """Remove sandboxes whose owning pool is dead, killing what still runs under their uids.

    Returns how many were removed. A sandbox's uid is the owner of its `work/` (which only root can
    give away); it is only purged if its slot lock under `uid_lock_dir` can be taken: a lock held by
    a live pool means that pool owns the uid now and has purged it already.
    """
    root = Path(root) if root is not None else default_root()
    if not root.is_dir():
        return 0
    removed = 0
    for base in root.iterdir():
        if not base.name.startswith(PREFIX) or not base.is_dir():
            continue
        owner = sandbox_owner(base)
        if owner is None:
            with contextlib.suppress(OSError):
                if time.time() - base.stat().st_mtime > UNOWNED_GRACE_S:
                    remove_sandbox_dir(base)
                    removed += 1
            continue
        if owner_alive(owner):
            continue
        uid = _work_uid(base)
        if uid is not None:
            slot = try_lock(uid, (uid_lock_dir or default_uid_lock_dir()) / f"{uid}.lock")
            if slot is not None:
                unlock(slot, clean=kill_uid_processes(uid))
        remove_sandbox_dir(base)
        removed += 1
    return removed


def _work_uid(base: Path) -> int | None:
    """The dedicated uid a sandbox ran under: its work directory's owner, when this pool is root and
    that owner is neither root nor us."""
    if os.geteuid() != 0:
        return None
    try:
        uid = os.lstat(base / "work").st_uid
    except OSError:
        return None
    return uid if uid != 0 else None
