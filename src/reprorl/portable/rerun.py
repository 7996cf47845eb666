"""Reproducing from a bundle: the run imported, the Python environment checked against its lock, and
the recorded code state rebuilt in a scratch worktree when the code here is not it.

The lock is the package list the run recorded (`run.json` `environment.packages`, every installed
distribution and its version, and the Python version). The code state is the commit, uncommitted
diff and untracked files of the checkout that holds the reprorl package; where this machine's
checkout has that commit, a detached worktree at it gets the diff applied and the bundle's untracked
files written, and the rerun runs from there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprorl.errors import UserInputError
from reprorl.portable.importing import ModelFinder, import_bundle
from reprorl.portable.reading import Opened, read_bundle
from reprorl.store import Store
from reprorl.store.environment import capture_environment, git_state
from reprorl.store.runs import IMPORT_FILE

GIT_TIMEOUT_S = 120.0
PACKAGE_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Prepared:
    run_id: str
    bundle_id: str
    imported: bool  # False: the run was already in this store, from this very bundle
    package_diff: tuple[str, ...]  # "- name==recorded" / "+ name==here" lines, as a diff shows them
    python: tuple[str, str]  # recorded, here
    code: str  # "here": this checkout is the recorded state; "worktree": rebuilt; "unavailable"
    worktree: Path | None
    code_notes: tuple[str, ...]


def package_diff(recorded: dict[str, str], here: dict[str, str]) -> tuple[str, ...]:
    """The packages that differ, sorted by name: `-` what the run had, `+` what is here."""
    lines: list[str] = []
    for name in sorted(set(recorded) | set(here)):
        if recorded.get(name) == here.get(name):
            continue
        if name in recorded:
            lines.append(f"- {name}=={recorded[name]}")
        if name in here:
            lines.append(f"+ {name}=={here[name]}")
    return tuple(lines)


def prepare(store: Store, bundle: Path, scratch: Path, *, find_model: ModelFinder) -> Prepared:
    """Import the bundle (unless this store already holds its run from it), compare the environment
    with its lock, and rebuild the recorded code state under `scratch` where it differs from here."""
    opened = read_bundle(bundle)
    run_id = opened.manifest.run_id
    folder = store.runs_dir / run_id
    imported = not folder.exists()
    if imported:
        import_bundle(store, bundle, find_model=find_model)
    else:
        came_from = folder / IMPORT_FILE
        source = json.loads(came_from.read_text()).get("bundle") if came_from.is_file() else None
        if source != opened.bundle_id:
            raise UserInputError(
                f"run {run_id} is already in {store.root}, not from this bundle: reproduce it with "
                f"`reprorl reproduce {run_id}`, or use another store (--home)"
            )
    info = json.loads(opened.small[f"runs/{run_id}/run.json"])
    environment: dict[str, Any] = info.get("environment", {})
    here = capture_environment()
    diff = package_diff(environment.get("packages", {}), here["packages"])
    python = (str(environment.get("python", "")).split()[0], sys.version.split()[0])
    code, worktree, notes = _code_state(opened, environment.get("code") or {}, scratch)
    return Prepared(run_id, opened.bundle_id, imported, diff, python, code, worktree, tuple(notes))


def _code_state(
    opened: Opened, recorded: dict[str, Any], scratch: Path
) -> tuple[str, Path | None, list[str]]:
    """Which recorded checkout holds reprorl, and whether this machine runs that code or rebuilds it."""
    current = git_state(PACKAGE_DIR)
    which = "reprorl" if recorded.get("reprorl") else "cwd"
    state = recorded.get(which) or {}
    commit = state.get("commit")
    if not commit:
        return "unavailable", None, ["the run recorded no commit: it reruns on the code here"]
    if current is None:
        return (
            "unavailable",
            None,
            [f"reprorl here is not in a git checkout: commit {commit} cannot be checked out"],
        )
    if (
        current.get("commit") == commit
        and (current.get("diff") or "") == (state.get("diff") or "")
        and sorted(current.get("untracked") or []) == sorted(state.get("untracked") or [])
    ):
        return "here", None, []
    root = Path(str(current["root"]))
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        return "unavailable", None, [f"commit {commit} is not in {root}: fetch it, then reproduce again"]
    notes: list[str] = []
    worktree = scratch / "code"
    if _git(root, "worktree", "add", "--detach", str(worktree), commit) is None:
        return "unavailable", None, [f"git could not check out {commit} into {worktree}"]
    if state.get("diff_truncated"):
        notes.append("the recorded diff was cut at its size limit; the worktree has the part kept")
    if state.get("diff"):
        patch = scratch / "recorded.diff"
        patch.write_text(str(state["diff"]))
        if _git(worktree, "apply", "--binary", str(patch)) is None:
            notes.append(
                "the recorded uncommitted diff does not apply to its commit; the worktree has the commit only"
            )
    _untracked(opened, which, worktree, notes)
    return "worktree", worktree, notes


def _untracked(opened: Opened, which: str, worktree: Path, notes: list[str]) -> None:
    prefix = f"code/untracked/{which}/"
    wanted = [m.path for m in opened.manifest.members if m.path.startswith(prefix)]
    if not wanted:
        return
    with tarfile.open(opened.path, mode="r|") as tar:
        for info in tar:
            if info.name in wanted:
                handle = tar.extractfile(info)
                if handle is not None:
                    target = worktree / info.name.removeprefix(prefix)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with target.open("wb") as out:
                        shutil.copyfileobj(handle, out)
    notes.append(f"{len(wanted)} untracked file(s) written from the bundle (as they were at export)")


def remove_worktree(worktree: Path) -> None:
    current = git_state(PACKAGE_DIR)
    if current is not None:
        _git(Path(str(current["root"])), "worktree", "remove", "--force", str(worktree))
    shutil.rmtree(worktree, ignore_errors=True)


def _git(cwd: Path, *argv: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *argv], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
