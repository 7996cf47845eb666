"""The pool's handle on the zygote process: start it, send it requests, and hear which sandboxes died.

Requests are pipelined: each carries an id and its reply resolves a future, so many sandboxes can
open at once without a lock, and the event loop is never blocked (the control socket is
non-blocking and read by a reader callback). If the zygote dies, every waiting request fails with
`SandboxError` and the pool starts a new one on its next request; sandboxes already running keep
their channels, because they never depended on the zygote after being forked.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from reprorl.envs.sandbox.errors import SandboxError
from reprorl.envs.sandbox.protocol import CONTROL_MESSAGE_BYTES, decode_control, encode_control
from reprorl.threads import off_loop

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
# The zygote starts without running `reprorl/__init__.py` (the whole public API: about 600 modules).
# Every sandbox is a fork of it, and a fork costs in proportion to what the process has mapped and
# what the sandbox then touches: from a zygote holding the whole API (67 MiB) a 4-call episode's
# sandbox took 1.6 ms more CPU than from a lean one (42 MiB). A tool module that imports from the
# public API as the docs show (`from reprorl import tool`) gets each name from the one submodule that
# defines it, read off the package's own `__init__.py` (its `from reprorl.x import ...` lines and its
# `_LAZY` table), so the package's `__init__` itself never runs here.
LEAN_START = """
import ast, importlib, importlib.util, runpy, sys
spec = importlib.util.find_spec("reprorl")
package = importlib.util.module_from_spec(spec)
sys.modules["reprorl"] = package
def _sources():
    with open(spec.origin, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("reprorl."):
            found.update({alias.asname or alias.name: node.module for alias in node.names})
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_LAZY" for t in node.targets):
            found.update(ast.literal_eval(node.value))
    return found
sources = _sources()
def __getattr__(name):
    module = sources.get(name)
    if module is None:
        raise AttributeError(f"module 'reprorl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    setattr(package, name, value)
    return value
package.__getattr__ = __getattr__
del _sources
runpy.run_module("reprorl.envs.sandbox.worker", run_name="__main__", alter_sys=True)
"""


class ExitInfo(NamedTuple):
    """How a sandbox process ended: raw wait status, and CPU seconds used by it and its reaped children."""

    status: int
    cpu_s: float


def _package_parent() -> str:
    """The directory holding the `reprorl` package, so the zygote imports this very copy of it."""
    return str(Path(__file__).resolve().parents[3])


class ZygoteClient:
    """One zygote process and the futures of the requests sent to it."""

    def __init__(self, modules: Sequence[str], sys_path: Sequence[str]) -> None:
        self.modules = tuple(modules)
        self.sys_path = tuple(sys_path)
        self.tools: dict[str, frozenset[str]] = {}
        self.pid = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._exits: dict[int, asyncio.Future[ExitInfo | None]] = {}
        self._alive = False
        # One sender waits for the control socket at a time: asyncio keeps one writer callback per
        # fd, so two waiting senders would overwrite each other's and one would wait for ever (a
        # thousand sandboxes opening at once filled the socket and hung every episode).
        self._send_lock: asyncio.Lock | None = None

    @property
    def alive(self) -> bool:
        return self._alive

    async def start(self) -> None:
        """Start the interpreter, pre-import the tool modules, and fail loudly if one cannot be imported."""
        self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # A scrubbed environment: the zygote and its sandboxes must not inherit the trainer's
            # secrets (API keys, tokens) through os.environ.
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "LANG": "C.UTF-8",
                "PYTHONPATH": _package_parent(),
            }
            self._process = subprocess.Popen(
                [sys.executable, "-c", LEAN_START, "--fd", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        self._control = ours
        self._alive = True
        self._ready = self._loop.create_future()
        self._loop.add_reader(ours.fileno(), self._on_readable)
        self._send_now({"op": "init", "modules": list(self.modules), "sys_path": list(self.sys_path)})
        try:
            ready = await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT_S)
        except BaseException:
            await self.stop()
            raise
        if ready["errors"]:
            await self.stop()
            problems = "; ".join(f"{name}: {error}" for name, error in ready["errors"].items())
            raise SandboxError(f"the sandbox zygote could not import tool modules: {problems}")
        self.pid = int(ready["pid"])
        self.tools = {name: frozenset(attrs) for name, attrs in ready["tools"].items()}

    async def spawn(
        self, spec: dict[str, Any], channel: socket.socket
    ) -> tuple[int, asyncio.Future[ExitInfo | None]]:
        """Fork a sandbox process that serves `channel` (passed over SCM_RIGHTS).

        Returns its pid and a future that resolves once the zygote has reaped it (None if the
        zygote died first and the ending cannot be known).
        """
        reply = await self._request({"op": "spawn", "spec": spec}, fds=[channel.fileno()])
        exit_future: asyncio.Future[ExitInfo | None] = reply["exit"]
        return int(reply["pid"]), exit_future

    async def kill(self, *, uid: int | None, pgid: int | None, token: str) -> None:
        """Kill every process of `uid` (or of process group `pgid`) and wait until none is left."""
        await self._request({"op": "kill", "uid": uid, "pgid": pgid, "token": token})

    async def snapshot(self, *, src: Path, dst: Path, uid: int | None, gid: int | None) -> None:
        await self._request({"op": "snapshot", "src": str(src), "dst": str(dst), "uid": uid, "gid": gid})

    async def stop(self) -> None:
        """Close the control socket; the zygote kills what it started and exits."""
        self._closed("the sandbox pool stopped its zygote")
        process = self._process
        if process is None:
            return
        try:
            await asyncio.wait_for(off_loop(process.wait), STOP_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await off_loop(process.wait)

    async def _request(self, message: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        if not self._alive or self._loop is None:
            raise SandboxError("the sandbox zygote is not running")
        rid = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._pending[rid] = future
        try:
            await self._send({**message, "id": rid}, fds)
            reply = await future
        finally:
            self._pending.pop(rid, None)
        if not reply.get("ok"):
            raise SandboxError(f"sandbox zygote: {message['op']} failed: {reply.get('error')}")
        return reply

    def _send_now(self, message: dict[str, Any], fds: Sequence[int] = ()) -> bool:
        assert self._control is not None
        try:
            socket.send_fds(self._control, [encode_control(message)], list(fds))
        except BlockingIOError:
            return False
        return True

    async def _send(self, message: dict[str, Any], fds: Sequence[int]) -> None:
        if self._send_lock is None:
            self._send_lock = asyncio.Lock()
        async with self._send_lock:
            await self._send_in_turn(message, fds)

    async def _send_in_turn(self, message: dict[str, Any], fds: Sequence[int]) -> None:
        while True:
            try:
                if self._send_now(message, fds):
                    return
            except OSError as exc:
                self._closed(f"the sandbox zygote went away ({exc})")
                raise SandboxError("the sandbox zygote is not running") from None
            assert self._loop is not None and self._control is not None
            writable = self._loop.create_future()
            self._loop.add_writer(self._control.fileno(), writable.set_result, None)
            try:
                await writable
            finally:
                self._loop.remove_writer(self._control.fileno())

    def _on_readable(self) -> None:
        assert self._control is not None
        while True:
            try:
                data = self._control.recv(CONTROL_MESSAGE_BYTES)
            except BlockingIOError:
                return
            except OSError as exc:
                self._closed(f"the sandbox zygote's channel failed ({exc})")
                return
            except BaseException as exc:
                # A message that cannot be taken (a refused allocation) would leave the socket
                # readable, and this callback called again for ever: the channel is given up.
                self._closed(f"the sandbox zygote's channel failed ({type(exc).__name__}: {exc})")
                raise
            if not data:
                self._closed("the sandbox zygote exited")
                return
            self._dispatch(decode_control(data))

    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "exit":
            future = self._exits.pop(message["pid"], None)
            if future is not None and not future.done():
                future.set_result(ExitInfo(int(message["status"]), float(message["cpu_s"])))
        elif op == "reply":
            pending = self._pending.get(message["id"])
            if pending is not None and not pending.done():
                if "pid" in message:
                    # Registered here, before any later exit event of this pid can be dispatched.
                    message["exit"] = self._exits[message["pid"]] = pending.get_loop().create_future()
                pending.set_result(message)
        elif op == "ready" and self._ready is not None and not self._ready.done():
            self._ready.set_result(message)

    def _closed(self, reason: str) -> None:
        if not self._alive:
            return
        self._alive = False
        if self._control is not None and self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._control.fileno())
            self._control.close()
        for future in (*self._pending.values(), *((self._ready,) if self._ready else ())):
            if not future.done():
                future.set_exception(SandboxError(reason))
        for exit_future in self._exits.values():
            if not exit_future.done():
                exit_future.set_result(None)
        self._exits.clear()
