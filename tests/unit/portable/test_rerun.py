"""Reproducing from a bundle: the package lock compared as a diff, and the recorded code state
(commit, uncommitted diff, untracked files) rebuilt in a scratch worktree of this checkout."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from reprorl.cli.reproduce_cmd import RERUN
from reprorl.portable import rerun
from reprorl.portable.manifest import Manifest, Member
from reprorl.portable.reading import Opened


def test_the_package_diff_lists_what_the_run_had_and_what_is_here() -> None:
    recorded = {"torch": "2.13.0", "numpy": "2.1.0", "gone": "1.0"}
    here = {"torch": "2.13.0", "numpy": "2.2.0", "new": "0.1"}
    assert rerun.package_diff(recorded, here) == (
        "- gone==1.0",
        "+ new==0.1",
        "- numpy==2.1.0",
        "+ numpy==2.2.0",
    )
    assert rerun.package_diff(here, dict(here)) == ()


def git(cwd: Path, *argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=cwd, check=True, capture_output=True, text=True).stdout


def test_the_recorded_code_state_is_rebuilt_in_a_worktree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@x")
    git(repo, "config", "user.name", "t")
    (repo / "src" / "mod.py").write_text("VALUE = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    recorded_commit = git(repo, "rev-parse", "HEAD").strip()
    (repo / "src" / "mod.py").write_text("VALUE = 2\n")
    diff = git(repo, "diff", "HEAD", "--binary")
    git(repo, "commit", "-qam", "two")  # this checkout has moved on since the run
    monkeypatch.setattr(rerun, "PACKAGE_DIR", repo / "src")

    bundle = tmp_path / "b.tar"
    with tarfile.open(bundle, "w") as tar:
        data = b"NOTE = 'untracked'\n"
        info = tarfile.TarInfo("code/untracked/cwd/src/extra.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    member = Member(path="code/untracked/cwd/src/extra.py", sha256="0" * 64, size=19)
    manifest = Manifest(run_id="r", spec_hash="s", created_at="t", checkpoints=False, members=[member])
    opened = Opened(bundle, manifest, manifest.bundle_id(), {})
    state = {"commit": recorded_commit, "dirty": True, "diff": diff, "untracked": ["src/extra.py"]}

    code, worktree, notes = rerun._code_state(opened, {"cwd": state}, tmp_path / "scratch")
    try:
        assert code == "worktree" and worktree is not None
        assert (worktree / "src" / "mod.py").read_text() == "VALUE = 2\n"  # the commit, diff applied
        assert (worktree / "src" / "extra.py").read_text() == "NOTE = 'untracked'\n"
        assert git(worktree, "rev-parse", "HEAD").strip() == recorded_commit
        assert any("1 untracked file(s)" in n for n in notes)
    finally:
        rerun.remove_worktree(worktree)  # type: ignore[arg-type]
    assert not worktree.exists()
    assert recorded_commit not in git(repo, "worktree", "list")

    unknown = {"commit": "f" * 40, "dirty": False}
    code, worktree, notes = rerun._code_state(opened, {"cwd": unknown}, tmp_path / "scratch2")
    assert (code, worktree) == ("unavailable", None) and "is not in" in notes[0]


def test_the_rebuilt_checkouts_cli_is_run_by_a_command_that_runs_it() -> None:
    """The rerun from a rebuilt worktree starts the CLI with `-c RERUN` (a `-m` of the CLI module
    runs nothing and exits 0): it must reach the `reproduce` command and its options."""
    done = subprocess.run(
        [sys.executable, "-c", RERUN, "reproduce", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "--bundle" in done.stdout, done.stderr
    bad = subprocess.run(
        [sys.executable, "-c", RERUN, "reproduce"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and "give the RUN" in bad.stderr
