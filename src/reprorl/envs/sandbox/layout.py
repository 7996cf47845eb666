"""Sandboxes on disk and their uids: the pool root, one directory per sandbox, owner records, reaping.

    <root>/                 mode 0711: sandboxes can pass through but not list it
      sbx-<id>/             root-owned, 0711
        owner.json          which pool (pid + start time) owns it, and the uid it runs under
        work/               the agent-visible root, owned by the sandbox uid, 0700
        snapshot/           read-only copy of work/ (see snapshot.py), made on request

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
OWNER_FILE = "owner.json"
PREFIX = "sbx-"
# A directory without an owner file is one a pool is still creating, unless it is older than this.
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
    """Make a fresh sandbox directory with a random id (unguessable, so sandboxes cannot find each other)."""
    sandbox_id = secrets.token_hex(8)
    dirs = SandboxDirs(root / f"{PREFIX}{sandbox_id}")
    if not root.is_dir():  # a temp cleaner (or an operator) removed it while the pool ran
        prepare_root(root)
    dirs.base.mkdir(mode=0o711)
    dirs.base.chmod(0o711)
    record = {
        **owner_record(os.getpid()),
        "uid": slot.uid if slot else None,
        "lock": str(slot.lock) if slot else None,
    }
    fd = os.open(dirs.base / OWNER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(record))
    dirs.work.mkdir(mode=0o700)
    if slot is not None:
        os.chown(dirs.work, slot.uid, slot.gid)
    return sandbox_id, dirs


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


def owner_record(pid: int) -> dict[str, Any]:
    return {"pid": pid, "start": process_start_ticks(pid)}


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


def reap_sandboxes(root: Path | str | None = None) -> int:
    """Remove sandboxes whose owning pool is dead, killing what still runs under their uids.

    Returns how many were removed. A uid is only purged if its slot lock can be taken: a lock held
    by a live pool means that pool owns the uid now and has purged it already.
    """
    root = Path(root) if root is not None else default_root()
    if not root.is_dir():
        return 0
    removed = 0
    for base in root.iterdir():
        if not base.name.startswith(PREFIX) or not base.is_dir():
            continue
        try:
            record = json.loads((base / OWNER_FILE).read_text())
            if not isinstance(record, dict):
                raise ValueError("owner record is not an object")
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                if time.time() - base.stat().st_mtime > UNOWNED_GRACE_S:
                    remove_sandbox_dir(base)
                    removed += 1
            continue
        if owner_alive(record):
            continue
        uid, lock = record.get("uid"), record.get("lock")
        if isinstance(uid, int) and os.geteuid() == 0:
            slot = try_lock(uid, Path(lock)) if isinstance(lock, str) else None
            if slot is not None or lock is None:
                clean = kill_uid_processes(uid)
                if slot is not None:
                    unlock(slot, clean=clean)
        remove_sandbox_dir(base)
        removed += 1
    return removed
