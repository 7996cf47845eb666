"""File-tree final states: exactly the expected files, edited ones by parsed value, the rest byte for byte.

The reference lists every file that must exist at the end: `files` maps a path to the sha256 of its
expected bytes (untouched and moved files), `parsed` maps a path to its format and expected parsed
content (edited files, so reformatting is fine but every value counts). A file that is missing,
extra, changed, or reached through a link makes the state wrong. Answer tasks also need the right
answer, with the tree untouched.
"""

from __future__ import annotations

import configparser
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprorl.hashing import sha256_hex
from reprorl.rewards.base import FinalState, StateAccessError, Verifier
from reprorl.rewards.registered import register_verifier
from reprorl.rewards.verifiers.answers import answer_matches
from reprorl.types import Task


def parse_config(fmt: str, text: str) -> Any:
    """A config file's content; INI values stay strings (INI has no types)."""
    if fmt == "json":
        return json.loads(text)
    if fmt == "toml":
        return tomllib.loads(text)
    if fmt == "ini":
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(text)
        return {section: dict(parser[section]) for section in parser.sections()}
    raise ValueError(f"unknown config format {fmt!r}")


def list_files(state: FinalState, max_files: int = 10_000) -> list[str]:
    """Every regular file under the work directory, relative and sorted; a link anywhere is refused."""
    root = state.path(".")
    found: list[str] = []
    pending = [root]
    while pending:
        directory = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                relative = Path(entry.path).relative_to(root).as_posix()
                if entry.is_symlink():
                    raise StateAccessError(f"{relative!r} is a symbolic link")
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    found.append(relative)
                else:
                    raise StateAccessError(f"{relative!r} is not a regular file")
                if len(found) > max_files:
                    raise StateAccessError(f"more than {max_files} files")
    return sorted(found)


@register_verifier("file_tree")
@dataclass(frozen=True)
class FileTreeState(Verifier):
    """Scores files tasks from the final work directory and the agent's answer."""

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        assert isinstance(task.reference, dict), "files tasks carry a dict reference"
        reference: dict[str, Any] = dict(task.reference)
        digests: dict[str, str] = reference["files"]
        parsed: dict[str, dict[str, Any]] = reference["parsed"]
        checks: dict[str, bool] = {}
        try:
            present = list_files(state)
            exact = set(present) == set(digests) | set(parsed)
            for path in present:
                if path in digests or path in parsed:
                    checks[path] = self._matches(state, path, digests.get(path), parsed.get(path))
            exact = exact and all(checks.values())
        except StateAccessError:
            exact = False  # the agent left a link or a device where files belong: never followed
        components = {"exact_state": float(exact)}
        if reference["kind"] == "answer":
            distractors = [str(d) for d in reference.get("distractors") or []]
            right = answer_matches(state.answer or "", reference["answer"], distractors)
            components["answer"] = float(right)
            components[self.name] = float(right and exact)
        else:
            targets = reference.get("targets") or []
            components["target_files"] = float(all(checks.get(p, False) for p in targets))
            components[self.name] = float(exact)
        return components

    @staticmethod
    def _matches(state: FinalState, path: str, digest: str | None, expected: dict[str, Any] | None) -> bool:
        text = state.read_text(path)
        if text is None:
            return False
        if digest is not None:
            return sha256_hex(text.encode("utf-8")) == digest
        assert expected is not None
        try:
            return bool(parse_config(str(expected["format"]), text) == expected["data"])
        except (ValueError, configparser.Error):
            return False
