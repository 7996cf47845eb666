"""The exception hierarchy: every error reprorl raises on purpose derives from `ReprorlError`.

Each subclass also derives from the builtin a caller would naturally catch (`ValueError`,
`KeyError`, `OSError`, ...), so code that does not know reprorl still handles it sensibly.
`UserInputError` and its children are the errors a person can fix: the CLI prints their message
as one line and exits with code 2.
"""

from __future__ import annotations


class ReprorlError(Exception):
    """Root of every error reprorl raises deliberately."""


class UserInputError(ReprorlError, ValueError):
    """Bad input from a person (a config, a task file, a CLI flag); the message names the fix."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class SpecError(UserInputError):
    """A run spec that cannot be parsed or does not validate; `problems` lists every one found, each a
    line naming its field and the fix (the message is the first, naming the fields of the rest)."""

    def __init__(self, message: str, *, field: str | None = None, more: tuple[str, ...] = ()) -> None:
        first = f"{field}: {message}" if field else message
        self.problems = (first, *more)
        if more:
            names = ", ".join(line.split(":", 1)[0] for line in more[:8]) + (", …" if len(more) > 8 else "")
            message += f" (and {len(more)} more problem{'s' if len(more) > 1 else ''}: {names})"
        super().__init__(message, field=field)


class FloatingReferenceError(SpecError):
    """An artifact reference uses a label that can move (`latest`, `main`, ...) instead of a version."""


class NotFoundError(ReprorlError, KeyError):
    """A named artifact, version, hash or run does not exist."""

    def __str__(self) -> str:
        # KeyError's str() wraps the message in quotes; a person should read it plainly.
        return str(self.args[0]) if self.args else ""


class ArtifactNotFoundError(NotFoundError):
    """No artifact matches the given name, version or hash."""


class RunNotFoundError(NotFoundError):
    """No run has the given id."""


class AmbiguousReferenceError(UserInputError):
    """A hash prefix matches more than one artifact."""


class StoreError(ReprorlError, OSError):
    """The artifact store or registry could not complete an operation."""


class IntegrityError(StoreError):
    """Stored bytes no longer hash to the address they were stored under."""

    def __init__(self, message: str, *, artifact: str, expected: str, actual: str) -> None:
        self.artifact = artifact
        self.expected = expected
        self.actual = actual
        super().__init__(message)


class RegistryError(StoreError):
    """The run/artifact registry database refused an operation."""


class RecordError(StoreError):
    """A run record on disk is missing, incomplete or inconsistent."""


class InferenceError(ReprorlError, OSError):
    """An infrastructure failure: a model server could not be reached or did not answer usably.

    Raised after bounded retries (or at once for a request the server refuses); not a fault of the
    model's output, so a rollout that meets it ends as an infra error rather than a bad action.
    """

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1) -> None:
        self.status = status  # the last HTTP status, or None when no response came back
        self.attempts = attempts
        super().__init__(message)


class ResourceExhaustedError(ReprorlError, RuntimeError):
    """The machine ran out of memory or disk space under a run; the run stays resumable.

    `resource` is "memory" or "disk". The message names what ran out, where, and the command that
    continues the run once there is more of it.
    """

    def __init__(self, message: str, *, resource: str = "") -> None:
        self.resource = resource
        super().__init__(message)

    def __reduce__(self) -> tuple[type[ResourceExhaustedError], tuple[str], dict[str, str]]:
        # Crosses process boundaries (a Ray trainer actor) with its keyword intact.
        return (type(self), (str(self),), {"resource": self.resource})
