"""The tool context: what a tool function running inside a sandbox is told about where it acts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ToolContext:
    """Passed as the first argument of every sandboxed tool function `fn(ctx, **kwargs) -> str`."""

    root: Path
    """The directory the call acts in: the sandbox's `work/`, or its read-only `snapshot/`."""
    snapshot: bool = False
    """True when `root` is the snapshot, i.e. the tool is being served stale data."""
