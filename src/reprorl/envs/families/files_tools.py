"""The files family's sandboxed tools over the episode's workspace, and the function that builds it.

Every path goes through `workspace_path`, so `..`, absolute paths and links that lead out are
refused. Outputs are bounded (entries, lines, matches), and each says what it left out. The
sandbox imports this module, so it stays free of the env machinery.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reprorl.envs.common import workspace_path
from reprorl.envs.errors import InvalidArguments, UnsafeAction
from reprorl.envs.tool import tool
from reprorl.types import Permission

MAX_ENTRIES = 100
MAX_CAT_LINES = 200
MAX_CAT_CHARS = 8000
MAX_READ_BYTES = 1 << 20
MAX_MATCHES = 50
MAX_MATCH_LINE_CHARS = 500
MAX_SHOWN_LINE_CHARS = 200
MAX_SCAN_BYTES = 2 << 20
MAX_PATTERN_CHARS = 100
MAX_UNBOUNDED_REPEATS = 4
MAX_WRITE_BYTES = 64_000
MAX_SETUP_FILES = 200


def _root(ctx: Any) -> Path:
    return Path(ctx.root).resolve()


def _shown(ctx: Any, path: Path) -> str:
    relative = path.relative_to(_root(ctx)).as_posix()
    return relative if relative != "." else "."


def _existing(ctx: Any, path: str) -> Path:
    target = workspace_path(ctx, path)
    if not target.exists():  # a path the caller got wrong: the model's mistake, not the tool's
        raise InvalidArguments(f"no such file or directory: {path}")
    return target


@tool(Permission.READ, params={"path": "A directory (or file) relative to the workspace; '.' is the top."})
def ls(ctx: Any, path: str = ".") -> str:
    """List a directory: subdirectories end in '/', files show their size in bytes."""
    target = _existing(ctx, path)
    if not target.is_dir():
        return f"{_shown(ctx, target)} ({target.stat().st_size} bytes)"
    entries = sorted(os.scandir(target), key=lambda e: e.name)
    lines = []
    for entry in entries[:MAX_ENTRIES]:
        if entry.is_symlink():
            lines.append(f"{entry.name}@ (link)")
        elif entry.is_dir():
            lines.append(f"{entry.name}/")
        else:
            lines.append(f"{entry.name} ({entry.stat().st_size} bytes)")
    if len(entries) > MAX_ENTRIES:
        lines.append(f"({len(entries) - MAX_ENTRIES} more entries not shown)")
    return "\n".join(lines) or "(empty directory)"


@tool(Permission.READ, params={"path": "A file relative to the workspace."})
def cat(ctx: Any, path: str) -> str:
    """Show a file's content (at most 200 lines; the end says how many more there were)."""
    target = _existing(ctx, path)
    if target.is_dir():
        raise InvalidArguments(f"{path} is a directory; use ls")
    with target.open("rb") as handle:
        text = handle.read(MAX_READ_BYTES).decode("utf-8", "replace")
    lines = text.splitlines(keepends=True)
    shown = "".join(lines[:MAX_CAT_LINES])
    if len(shown) > MAX_CAT_CHARS:
        shown = shown[:MAX_CAT_CHARS]
        return shown + f"\n[cut at {MAX_CAT_CHARS} characters of {len(text)}]"
    if len(lines) > MAX_CAT_LINES:
        return shown + f"[{len(lines) - MAX_CAT_LINES} more lines not shown]"
    return shown


def check_pattern(pattern: str) -> None:
    """Refuse regular expressions that can take exponential time: nested or alternated repeats.

    Python's engine backtracks and cannot be interrupted, so the pattern's shape is checked before
    it runs: a repeated group may not itself contain a repeat or an alternation, backreferences are
    refused, and only a few unbounded repeats are allowed.
    """
    if re.search(r"\\[1-9]|\(\?P=", pattern):
        raise InvalidArguments("backreferences are not supported")
    inner = [False]  # per open group: does it contain a repeat or an alternation?
    unbounded = 0
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        following = pattern[i + 1] if i + 1 < len(pattern) else ""
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern.startswith("^]", i + 1) or following == "]":
                i += 1  # a leading ']' is literal
        elif c == "(":
            inner.append(False)
        elif c == ")" and len(inner) > 1:
            repeated = inner.pop()
            if following in ("*", "+", "{") and repeated:
                raise InvalidArguments("nested repeats such as (a+)+ or (a|b)* can take exponential time")
            inner[-1] = inner[-1] or repeated
        elif c in "*+{|":
            inner[-1] = True
            unbounded += c in "*+" or (c == "{" and re.match(r"\{\d*,\}", pattern[i:]) is not None)
        i += 1
    if unbounded > MAX_UNBOUNDED_REPEATS:
        raise InvalidArguments(f"more than {MAX_UNBOUNDED_REPEATS} unbounded repeats (* or +)")


def _files_under(ctx: Any, target: Path) -> Iterator[Path]:
    """Regular files under `target` in sorted order; links are skipped, never followed."""
    if target.is_file():
        yield target
        return
    for directory, subdirs, files in os.walk(target, followlinks=False):
        subdirs.sort()
        for name in sorted(files):
            path = Path(directory) / name
            if not path.is_symlink() and path.is_file():
                yield path


@tool(
    Permission.READ,
    params={
        "pattern": "The text to find (or a regular expression when regex is true); at most 100 characters.",
        "path": "A directory or file to search, relative to the workspace.",
        "regex": "Treat the pattern as a Python regular expression.",
    },
)
def grep(ctx: Any, pattern: str, path: str = ".", regex: bool = False) -> str:
    """Find lines containing a text in the files under a path; shows 'path:line: text', at most 50 matches."""
    if not pattern:
        raise InvalidArguments("the pattern is empty")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidArguments(f"the pattern is longer than {MAX_PATTERN_CHARS} characters")
    if regex:
        check_pattern(pattern)
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise InvalidArguments(f"not a valid regular expression: {exc}") from None
    else:
        compiled = re.compile(re.escape(pattern))
    target = _existing(ctx, path)
    matches: list[str] = []
    total = scanned = 0
    for file in _files_under(ctx, target):
        with file.open("rb") as handle:
            data = handle.read(MAX_READ_BYTES)
        if b"\x00" in data:
            continue  # binary
        scanned += len(data)
        if scanned > MAX_SCAN_BYTES:
            matches.append(f"(stopped after scanning {MAX_SCAN_BYTES} bytes; search a narrower path)")
            break
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
            if compiled.search(line[:MAX_MATCH_LINE_CHARS]):
                total += 1
                if total <= MAX_MATCHES:
                    matches.append(f"{_shown(ctx, file)}:{number}: {line[:MAX_SHOWN_LINE_CHARS]}")
    if total > MAX_MATCHES:
        matches.append(f"({total - MAX_MATCHES} more matches not shown)")
    return "\n".join(matches) if matches else "no matches"


@tool(
    Permission.WRITE,
    params={
        "path": "The file to write, relative to the workspace.",
        "content": "The file's complete new text.",
    },
)
def write_file(ctx: Any, path: str, content: str) -> str:
    """Replace a file's content (or create it, with its directories); at most 64,000 bytes."""
    data = content.encode("utf-8")
    if len(data) > MAX_WRITE_BYTES:
        raise InvalidArguments(f"content is {len(data)} bytes; the limit is {MAX_WRITE_BYTES}")
    if path.endswith("/") or path.strip() in ("", "."):
        raise InvalidArguments(f"{path!r} names a directory, not a file")
    target = workspace_path(ctx, path)
    if target.is_dir():
        raise InvalidArguments(f"{path} is a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return f"wrote {len(data)} bytes to {_shown(ctx, target)}"


@tool(
    Permission.WRITE,
    params={
        "src": "The file or directory to move, relative to the workspace.",
        "dst": "The new path, or an existing directory (or one ending in '/') to move it into.",
    },
)
def move(ctx: Any, src: str, dst: str) -> str:
    """Move or rename a file or directory; it never overwrites an existing file."""
    source = _existing(ctx, src)
    root = _root(ctx)
    if source == root:
        raise InvalidArguments("the workspace itself cannot be moved")
    destination = workspace_path(ctx, dst)
    if dst.endswith("/") or destination.is_dir():
        destination = destination / source.name
    if destination == source:
        raise InvalidArguments("source and destination are the same")
    if source in destination.parents:
        raise InvalidArguments("a directory cannot be moved into itself")
    if destination.exists() or destination.is_symlink():
        raise UnsafeAction(f"{_shown(ctx, destination)} already exists; moving onto it would destroy it")
    destination.parent.mkdir(parents=True, exist_ok=True)
    source.rename(destination)
    return f"moved {_shown(ctx, source)} to {_shown(ctx, destination)}"


def build_state(ctx: Any, setup: dict[str, Any]) -> str:
    """Write a task's files (`{"files": {path: text}}`) into the workspace; run by the env, not the agent."""
    files = setup.get("files") if isinstance(setup, dict) else None
    if not isinstance(files, dict) or not files or len(files) > MAX_SETUP_FILES:
        raise ValueError(f"setup must be {{'files': {{path: text}}}} with 1 to {MAX_SETUP_FILES} files")
    for path, text in files.items():
        if not isinstance(path, str) or not isinstance(text, str) or Path(path).is_absolute() or ".." in path:
            raise ValueError(f"bad setup file entry {path!r}")
        target = workspace_path(ctx, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text.encode("utf-8"))
    return f"wrote {len(files)} files"
