"""Reaching programs outside reprorl from an env: a loop of their own thread, the version of their package."""

from __future__ import annotations

import asyncio
import importlib.metadata
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def installed_version(package: str | None) -> str | None:
    """The installed version of a Python package (None when it is not installed or not named)."""
    if package is None:
        return None
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_on_own_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end on an event loop of its own thread, and return what it returned
    (the caller may be inside a running loop, where `asyncio.run` is refused); blocks until then."""
    done: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(asyncio.run(make()))
        except BaseException as exc:
            failed.append(exc)

    worker = threading.Thread(target=run, name="reprorl-own-loop")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return done[0]
