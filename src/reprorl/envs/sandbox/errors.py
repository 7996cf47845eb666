"""Sandbox errors: failures of the sandbox machinery itself, never of the code a tool runs."""

from __future__ import annotations

from reprorl.errors import ReprorlError


class SandboxError(ReprorlError, RuntimeError):
    """The sandbox could not be started, used or torn down (an infrastructure failure)."""


class UnknownToolError(SandboxError, LookupError):
    """A function reference that names no callable of the modules the pool pre-imported."""
