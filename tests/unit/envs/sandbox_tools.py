"""Tool functions the sandbox tests call; the zygote imports this module from `tests/unit/envs`.

`run_python` executes arbitrary code inside the sandbox: the hostile probes act through it. The
modules it may need are imported here, because after dropping to its own uid a sandbox may be
unable to read the interpreter's files and so cannot import anything new.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PRELOADED = (ctypes, errno, resource, signal, socket, subprocess, sys)


def echo(ctx: Any, text: str) -> str:
    return text


def write(ctx: Any, path: str, text: str) -> str:
    target = Path(ctx.root, path)
    target.write_text(text)
    return str(len(text))


def read(ctx: Any, path: str) -> str:
    return Path(ctx.root, path).read_text()


def listdir(ctx: Any, path: str = ".") -> str:
    return "\n".join(sorted(p.name for p in Path(ctx.root, path).iterdir()))


def fail(ctx: Any, message: str) -> str:
    raise ValueError(message)


def sleep(ctx: Any, s: float) -> str:
    time.sleep(s)
    return "slept"


def big(ctx: Any, chars: int) -> str:
    return "x" * chars


def not_a_string(ctx: Any) -> str:
    return 42  # type: ignore[return-value]


def run_python(ctx: Any, code: str) -> str:
    """Execute `code` in the sandbox process; it reports back by setting `result`."""
    scope: dict[str, Any] = {"ctx": ctx, "result": ""}
    exec(code, scope)
    return str(scope["result"])


def loaded(ctx: Any, name: str) -> str:
    """Whether the sandbox's interpreter (a fork of the zygote) has imported module `name`."""
    return str(name in sys.modules)


def whoami(ctx: Any) -> str:
    return f"{os.getuid()} {os.getgid()} {os.getpid()} {os.getpgid(0)} {Path.cwd()}"
