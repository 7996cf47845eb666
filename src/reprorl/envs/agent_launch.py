"""The agent program's launch in its episode's sandbox: a callable called or a command run, output kept.

These functions run in the sandbox process (forked from the pool's zygote, under the sandbox's uid
and limits, in the episode's working directory). Whatever the agent does — return, raise, exit,
print without end — comes back as one JSON object; only a killed sandbox returns nothing, and the
episode's driver records that.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
import threading
import traceback
from collections import deque
from collections.abc import Mapping, Sequence
from typing import IO, Any

PYTHON = "{python}"  # in a command: the interpreter reprorl runs under


class _Tail(io.TextIOBase):
    """A text stream that keeps only its last `limit` characters (an agent may print without end)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.chunks, self.size = limit, deque[str](), 0

    def write(self, text: str) -> int:
        self.chunks.append(text)
        self.size += len(text)
        while self.chunks and self.size - len(self.chunks[0]) >= self.limit:
            self.size -= len(self.chunks.popleft())
        return len(text)

    def text(self) -> str:
        return "".join(self.chunks)[-self.limit :] if self.limit else ""


def _failure(exc: BaseException, limit: int) -> dict[str, Any]:
    trace = "".join(traceback.format_exception(exc))
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": trace[-limit:]}


def run_callable(
    ctx: Any,
    *,
    ref: str,
    base_url: str,
    api_key: str,
    model: str,
    task: Mapping[str, Any],
    output_chars: int,
) -> str:
    """Call `module:function(base_url=, api_key=, model=, task=)` and report what happened."""
    out, err = _Tail(output_chars), _Tail(output_chars)
    module, _, attr = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            value = fn(base_url=base_url, api_key=api_key, model=model, task=dict(task))
        report: dict[str, Any] = {
            "ok": True,
            "returned": None if value is None else str(value)[:output_chars],
        }
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are the agent's too
        report = _failure(exc, output_chars)
    return json.dumps({**report, "stdout": out.text(), "stderr": err.text()})


def _drain(stream: IO[bytes], tail: _Tail) -> None:
    for chunk in iter(lambda: stream.read(65536), b""):
        tail.write(chunk.decode("utf-8", "replace"))


def run_command(
    ctx: Any,
    *,
    argv: Sequence[str],
    base_url: str,
    api_key: str,
    model: str,
    task: Mapping[str, Any],
    output_chars: int,
) -> str:
    """Run `argv` (no shell) with the proxy's address and the task in its environment."""
    env = {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": api_key,
        "REPRORL_MODEL": model,
        "REPRORL_TASK": json.dumps(dict(task)),
    }
    out, err = _Tail(output_chars), _Tail(output_chars)
    args = [sys.executable if a == PYTHON else a for a in argv]
    try:
        process = subprocess.Popen(
            args,
            cwd=str(ctx.root),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:  # a missing program, or a task too large for the environment
        return json.dumps({**_failure(exc, output_chars), "stdout": "", "stderr": ""})
    assert process.stdout is not None and process.stderr is not None
    readers = [
        threading.Thread(target=_drain, args=(process.stdout, out), daemon=True),
        threading.Thread(target=_drain, args=(process.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    code = process.wait()
    for reader in readers:
        reader.join()
    report: dict[str, Any] = {"ok": code == 0, "exit_code": code}
    if code != 0:
        report["error"] = f"the agent command exited with status {code}"
    return json.dumps({**report, "stdout": out.text(), "stderr": err.text()})
