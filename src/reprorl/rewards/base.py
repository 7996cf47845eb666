"""Verifiers: outcome rewards computed from the final state of an episode, never from the agent's claims.

A verifier sees the task (with its hidden reference), the agent's final answer, and the sandbox's
work directory after every process in it was stopped. It returns named components in [0, 1];
the total is a weighted sum whose weights live in the run spec. A verifier's version is the hash
of its code and settings, and is stored on every reward it produced.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from reprorl.hashing import code_fingerprint, content_hash
from reprorl.types import Message, Reward, Task, Termination

MAX_READ_BYTES = 16 << 20


class StateAccessError(PermissionError):
    """The verifier was asked to read something outside the final state, or through a link."""


@dataclass(frozen=True)
class FinalState:
    """What the episode left behind: the answer (if any) and the frozen work directory."""

    answer: str | None
    workdir: Path
    termination: Termination
    reported: dict[str, float] | None = None
    """What an external env reported of the episode (an OpenEnv server's rewards), taken from the
    server by reprorl — never from the agent's work directory, which the agent can write."""
    env_state: str | None = None
    """The state an external env's own code kept of the episode, as JSON (a verifiers rollout's
    shared `State`, as its toolsets left it), taken by reprorl from that code's process in the
    sandbox after each call — never from the work directory."""
    transcript: tuple[Message, ...] = ()
    """The conversation as recorded: the task's prompt, then each turn's reply and tool results
    (for verifiers that judge the whole episode, a verifiers taskset's rewards among them)."""

    def path(self, relative: str) -> Path:
        """A regular file inside the work directory; links and escapes are refused.

        The agent controlled this directory, so a symlink could point a verifier at anything.
        """
        root = self.workdir.resolve()
        candidate = (root / relative).resolve()
        if candidate != root and root not in candidate.parents:
            raise StateAccessError(f"{relative!r} is outside the work directory")
        current = root
        for part in candidate.relative_to(root).parts:
            current = current / part
            if current.is_symlink():
                raise StateAccessError(f"{relative!r} goes through a symbolic link")
        return candidate

    def read_bytes(self, relative: str) -> bytes | None:
        """The file's bytes, or None when it does not exist (a missing file is a state, not a crash)."""
        path = self.path(relative)
        try:
            # Opening a FIFO for reading blocks until a writer comes, and no writer ever will: look first.
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise StateAccessError(f"{relative!r} is not a regular file")
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise StateAccessError(f"{relative!r} is not a regular file")
            return handle.read(MAX_READ_BYTES)

    def special_entries(self, limit: int = 10_000) -> list[str]:
        """Links, FIFOs, sockets and devices in the work directory (at most `limit` entries looked at).

        None of the built-in envs leaves one, so where a verifier fails on a state that holds one, the
        agent planted it and the failure is the agent's.
        """
        found: list[str] = []
        seen = 0
        for folder, dirs, files in os.walk(self.workdir, followlinks=False):
            for name in (*dirs, *files):
                seen += 1
                path = Path(folder) / name
                try:
                    mode = path.lstat().st_mode
                except OSError:
                    continue
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    found.append(str(path.relative_to(self.workdir)))
                if seen >= limit:
                    return found
        return found

    def read_text(self, relative: str) -> str | None:
        data = self.read_bytes(relative)
        return None if data is None else data.decode("utf-8", "replace")


class Verifier(ABC):
    """Scores an episode's outcome; subclasses are small, deterministic and side-effect free."""

    name: ClassVar[str] = "outcome"
    registry_name: ClassVar[str | None] = None  # set by `register_verifier`

    @abstractmethod
    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        """Named components in [0, 1]; the one named `self.name` is the outcome."""

    @property
    def version(self) -> str:
        """Hash of the verifier's code (its module and sibling helpers) and its settings."""
        settings: dict[str, Any] = dataclasses.asdict(self) if dataclasses.is_dataclass(self) else {}
        if not settings:  # a registered verifier that is no dataclass: the arguments it was built with
            settings = {k: repr(v) for k, v in getattr(self, "_registry_args", {}).items()}
        code = code_fingerprint(*type(self).__mro__)
        return content_hash({"verifier": type(self).__qualname__, "code": code, "settings": settings})


def compose(components: dict[str, float], weights: dict[str, float], verifier_version: str) -> Reward:
    """The weighted total of the components; unlisted components are kept but weigh nothing."""
    total = sum(weights.get(name, 0.0) * value for name, value in components.items())
    return Reward(total=total, components=dict(sorted(components.items())), verifier_version=verifier_version)
