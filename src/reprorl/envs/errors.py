"""Exceptions a tool raises to say what kind of failure happened, so it is classified correctly.

They travel from the sandbox by class name, so they must stay plain (no extra state).
"""

from __future__ import annotations


class UnsafeAction(Exception):
    """The action would do damage outside the task (e.g. DROP TABLE); it is refused and ends the episode."""


class OutsideSandbox(PermissionError):
    """A path or resource outside the episode's sandbox was requested."""


class InvalidArguments(ValueError):
    """Arguments fit the schema but make no sense (e.g. an empty expression)."""
