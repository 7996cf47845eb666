"""A sandbox root removed under a running pool (a temp cleaner sweeping /tmp) is made again, not a
failed episode."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reprorl.envs.sandbox.layout import (
    create_dirs,
    process_start_ticks,
    reap_sandboxes,
    remove_sandbox_dir,
    sandbox_owner,
    try_lock,
    unlock,
)
from reprorl.envs.sandbox.readonly import mount_points, parse_mountinfo


def test_a_removed_root_is_made_again_with_its_mode(tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    assert not root.exists()
    sandbox_id, dirs = create_dirs(root, None)
    try:
        start = process_start_ticks(os.getpid())
        assert dirs.base == root / f"sbx-{os.getpid()}.{start}.{sandbox_id}" and dirs.work.is_dir()
        assert root.stat().st_mode & 0o777 == 0o711
        assert sandbox_owner(dirs.base) == {"pid": os.getpid(), "start": start}
        assert sorted(p.name for p in dirs.base.iterdir()) == ["work"]  # the owner is the name alone
    finally:
        remove_sandbox_dir(dirs.base)
    assert not dirs.base.exists()


def test_a_dead_pools_sandbox_reaped_by_two_pools_at_once_is_removed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sandboxes"
    sandbox_id, dirs = create_dirs(root, None)
    (dirs.work / "left.txt").write_text("x")
    dead = dirs.base.rename(root / f"sbx-{2**22 + 1}.1.{sandbox_id}")  # no such process
    # The other pool removes each entry just before this one gets to it.
    real_unlink, real_rmdir = os.unlink, os.rmdir

    def raced(real: Callable[..., None]) -> Callable[..., None]:
        def call(path: Any, *args: Any, **kwargs: Any) -> None:
            real(path, *args, **kwargs)
            real(path, *args, **kwargs)  # raises FileNotFoundError, as the loser of the race sees

        return call

    monkeypatch.setattr(os, "unlink", raced(real_unlink))
    monkeypatch.setattr(os, "rmdir", raced(real_rmdir))
    assert reap_sandboxes(root) == 1
    assert not dead.exists()


def test_a_uid_slots_state_is_kept_in_its_lock_file_across_holders(tmp_path: Path) -> None:
    lock = tmp_path / "2000000.lock"
    slot = try_lock(2_000_000, lock)
    assert slot is not None and not slot.needs_purge  # an empty file: no pool ever used the uid
    assert try_lock(2_000_000, lock) is None  # held
    assert lock.read_bytes() == b"dirty"
    unlock(slot, clean=True)
    assert lock.read_bytes() == b"clean"
    slot = try_lock(2_000_000, lock)
    assert slot is not None and not slot.needs_purge
    unlock(slot, clean=False)  # processes of it may have survived: the next holder purges first
    slot = try_lock(2_000_000, lock)
    assert slot is not None and slot.needs_purge
    unlock(slot, clean=True)
    lock.write_bytes(b"something else, and longer")
    slot = try_lock(2_000_000, lock)
    assert slot is not None and slot.needs_purge and lock.read_bytes() == b"dirty"
    unlock(slot, clean=True)
    assert lock.read_bytes() == b"clean"


def test_mountinfo_lines_give_each_mount_point_unescaped_with_its_own_options() -> None:
    lines = [
        "22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n",
        "90 22 0:51 / /tmp/a\\040b\\134c rw,nosuid,nodev - tmpfs tmpfs rw,size=1024k\n",
        "91 22 0:52 / /srv ro,noexec master:3 - tmpfs tmpfs ro\n",
        "\n",
    ]
    assert parse_mountinfo(lines) == [
        ("/", "rw,relatime"),
        ("/tmp/a b\\c", "rw,nosuid,nodev"),
        ("/srv", "ro,noexec"),
    ]
    assert "/proc" in {point for point, _ in mount_points()}  # this very namespace's table
