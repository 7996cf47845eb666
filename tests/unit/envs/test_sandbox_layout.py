"""A sandbox root removed under a running pool (a temp cleaner sweeping /tmp) is made again, not a
failed episode."""

from __future__ import annotations

import json
import os
from pathlib import Path

from reprorl.envs.sandbox.layout import OWNER_FILE, create_dirs, remove_sandbox_dir


def test_a_removed_root_is_made_again_with_its_mode(tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    assert not root.exists()
    sandbox_id, dirs = create_dirs(root, None)
    try:
        assert dirs.base == root / f"sbx-{sandbox_id}" and dirs.work.is_dir()
        assert root.stat().st_mode & 0o777 == 0o711
        assert json.loads((dirs.base / OWNER_FILE).read_text())["pid"] == os.getpid()
    finally:
        remove_sandbox_dir(dirs.base)
    assert not dirs.base.exists()
