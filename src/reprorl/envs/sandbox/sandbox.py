"""One episode's sandbox: a private directory and a confined process that runs tool functions in it.

Calls on a sandbox are serialised; calls on different sandboxes run in parallel, and nothing here
blocks the event loop. Whatever the tool does (raise, hang, crash, flood its output, write garbage
to its channel) comes back as a `CallResult`; only failures of the machinery raise `SandboxError`.
After a timeout or a crash every process of the sandbox is killed and the next call forks a fresh
one on the same files.

Killing "every process" is exact. Under root each sandbox process is the init of its own PID
namespace: SIGKILL to it makes the kernel kill and reap everything inside (double-forked orphans
included) before the zygote reports its death. Without that, the zygote's kill helper kills by
uid (dedicated uids) or by process group (shared uid, the weakest case).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from reprorl.envs.sandbox import result as results
from reprorl.envs.sandbox.errors import SandboxError, UnknownToolError
from reprorl.envs.sandbox.layout import SandboxDirs, UidSlot, kill_uid_processes, remove_sandbox_dir
from reprorl.envs.sandbox.limits import SandboxLimits
from reprorl.envs.sandbox.protocol import FRAME_OVERHEAD_BYTES, ProtocolError, encode, read_frame, reply_limit
from reprorl.envs.sandbox.result import CallResult
from reprorl.envs.sandbox.zygote import ExitInfo, ZygoteClient
from reprorl.threads import off_loop

HELLO_TIMEOUT_S = 30.0
# How long a dead sandbox's exit status may take to arrive before the crash is reported without it.
EXIT_STATUS_WAIT_S = 2.0
# The kernel enforces RLIMIT_CPU on tick-sampled time, while the reaped rusage is the scheduler's
# exact runtime: on a busy machine a process preempted between ticks is charged whole ticks, so it
# can be killed at its limit having run a few percent less by the exact clock.
CPU_LIMIT_SHARE = 0.9
KILL_WAIT_S = 10.0


class SandboxHost(Protocol):
    """What a sandbox needs from its pool."""

    network: bool
    pid_namespaces: bool
    require_isolation: bool

    async def zygote(self) -> ZygoteClient: ...

    def tools(self) -> dict[str, frozenset[str]]: ...

    def release(self, sandbox: Sandbox, slot: UidSlot | None, *, clean: bool) -> None: ...


@dataclass
class _Child:
    pid: int
    pidfd: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    exit: asyncio.Future[ExitInfo | None]
    namespace_init: bool = False
    abandoned: bool = False


class Sandbox:
    """A fresh directory plus the confined process serving it; an async context manager that closes it."""

    def __init__(
        self,
        host: SandboxHost,
        sandbox_id: str,
        dirs: SandboxDirs,
        slot: UidSlot | None,
        limits: SandboxLimits,
        *,
        work_quota: str = "none",
    ) -> None:
        self.id = sandbox_id
        self.work_quota = work_quota
        self.dir = dirs.base
        self.workdir: Path = dirs.work
        self.snapshot_dir: Path = dirs.snapshot
        self.limits = limits
        self.uid = slot.uid if slot else None
        self.isolation: dict[str, str] = {}
        self.restarts = 0
        self._host = host
        self._slot = slot
        self._lock = asyncio.Lock()
        self._child: _Child | None = None
        self._last_pid: int | None = None
        self._generation = 0
        # True while processes of this sandbox may exist that no live child accounts for.
        self._needs_purge = slot.needs_purge if slot else False
        self._state = "open"  # open -> frozen -> closed
        self._has_snapshot = False
        self._call_ids = 0
        self._max_reply = reply_limit(limits.max_output_chars)

    # -- public API ------------------------------------------------------------------------------

    @property
    def has_snapshot(self) -> bool:
        return self._has_snapshot

    @property
    def waiting(self) -> bool:
        """Open, never called, and its process still alive: what a warm sandbox must be to be handed out."""
        child = self._child
        return (
            self._state == "open"
            and self._call_ids == 0
            and child is not None
            and not child.abandoned
            and not child.exit.done()
        )

    def info(self) -> dict[str, Any]:
        """A JSON-able record of this sandbox's conditions, for the trajectory."""
        return {
            "id": self.id,
            "dir": str(self.dir),
            "uid": self.uid,
            "limits": self.limits.model_dump(),
            "isolation": dict(self.isolation),
            "restarts": self.restarts,
        }

    async def call(
        self,
        fn_ref: str,
        kwargs: dict[str, Any],
        *,
        timeout_s: float | None = None,
        use_snapshot: bool = False,
    ) -> CallResult:
        """Run `fn(ctx, **kwargs)` in the sandbox; `fn_ref` is `module:function` of a pre-imported module."""
        module, _, attr = fn_ref.partition(":")
        if attr not in self._host.tools().get(module, frozenset()):
            raise UnknownToolError(f"{fn_ref!r} is not a function of the modules this sandbox pool imported")
        if use_snapshot and not self._has_snapshot:
            raise SandboxError(f"sandbox {self.id} has no snapshot; call take_snapshot() first")
        limit = self.limits.call_timeout_s if timeout_s is None else timeout_s
        self._call_ids += 1
        call_id = self._call_ids
        frame = encode({"id": call_id, "fn": fn_ref, "kwargs": kwargs, "snapshot": use_snapshot})
        async with self._lock:
            self._check_open()
            child = await self._ensure_child()
            started = time.perf_counter()
            try:
                async with asyncio.timeout(limit):
                    child.writer.write(frame)
                    await child.writer.drain()
                    reply = await read_frame(child.reader, self._max_reply)
            except TimeoutError:
                duration = time.perf_counter() - started
                await self._discard(child)
                return results.timed_out(limit, duration)
            except (asyncio.IncompleteReadError, ConnectionError):
                return await self._crashed(child, started)
            except ProtocolError as exc:
                await self._discard(child)
                return results.protocol_violation(str(exc), time.perf_counter() - started)
            except BaseException:  # cancelled mid-call: the channel is in an unknown state
                self._abandon(child)
                raise
            duration = time.perf_counter() - started
            try:
                return results.from_reply(reply, call_id, self.limits.max_output_chars, duration)
            except ProtocolError as exc:
                await self._discard(child)
                return results.protocol_violation(str(exc), duration)

    async def take_snapshot(self) -> None:
        """Copy `work/` to `snapshot/` (replacing an older one); calls with use_snapshot=True act there."""
        async with self._lock:
            self._check_open()
            zygote = await self._host.zygote()
            gid = self._slot.gid if self._slot else None
            await zygote.snapshot(src=self.workdir, dst=self.snapshot_dir, uid=self.uid, gid=gid)
            self._has_snapshot = True

    async def freeze(self) -> None:
        """Kill every process of the sandbox but keep its files: the state a verifier reads stays put."""
        if self._state != "open":
            return
        self._state = "frozen"
        # Not under the lock: a call in flight sees its process die and returns a crash.
        child = self._child
        try:
            await self._terminate(child)
        finally:
            async with self._lock:
                if child is not None:
                    self._release(child)

    async def close(self) -> None:
        """Kill every process of the sandbox and remove its directory. Idempotent."""
        if self._state == "closed":
            return
        failure: SandboxError | None = None
        try:
            await self.freeze()
        except SandboxError as exc:
            failure = exc
        self._state = "closed"
        async with self._lock:
            try:
                await off_loop(remove_sandbox_dir, self.dir)
            except OSError as exc:
                failure = failure or SandboxError(f"could not remove sandbox directory {self.dir}: {exc}")
            finally:
                self._host.release(self, self._slot, clean=not self._needs_purge)
        if failure is not None:
            raise failure

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Fork the first sandbox process (the pool calls this when it opens the sandbox)."""
        async with self._lock:
            await self._ensure_child()

    # -- the sandbox process ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "open":
            raise SandboxError(f"sandbox {self.id} is {self._state}")

    async def _ensure_child(self) -> _Child:
        if self._child is not None and self._child.abandoned:
            await self._discard(self._child)
        if self._child is not None:
            return self._child
        if self._needs_purge:
            await self._terminate(None)
        if self._generation:
            self.restarts += 1
        self._child = await self._spawn()
        return self._child

    async def _spawn(self) -> _Child:
        zygote = await self._host.zygote()
        self._generation += 1
        spec = {
            "token": self._token(),
            "dir": str(self.dir),
            "workdir": str(self.workdir),
            "snapshot_dir": str(self.snapshot_dir),
            "uid": self.uid,
            "gid": self._slot.gid if self._slot else None,
            "limits": self.limits.process_limits(),
            "network": self._host.network,
            "pid_namespace": self._host.pid_namespaces,
        }
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with theirs:
                pid, ended = await zygote.spawn(spec, theirs)
        except BaseException:
            ours.close()
            raise
        self._last_pid = pid
        self._needs_purge = True
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = -1
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=FRAME_OVERHEAD_BYTES)
        child = _Child(pid, pidfd, reader, writer, ended)
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                hello = await read_frame(reader, FRAME_OVERHEAD_BYTES)
            self.isolation = self._isolation_from(hello)
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            ConnectionError,
            ProtocolError,
            SandboxError,
        ) as exc:
            with contextlib.suppress(SandboxError):
                await self._discard(child)
            detail = exc if isinstance(exc, SandboxError) else f"no hello ({type(exc).__name__})"
            raise SandboxError(f"sandbox {self.id}: its process failed to start: {detail}") from None
        child.namespace_init = self.isolation.get("pid_namespace") == "yes"
        return child

    def _isolation_from(self, hello: Any) -> dict[str, str]:
        if isinstance(hello, dict) and isinstance(hello.get("setup_error"), str):
            raise SandboxError(hello["setup_error"][: results.MAX_ERROR_CHARS])
        if not isinstance(hello, dict) or not isinstance(hello.get("hello"), dict):
            raise SandboxError("malformed hello")
        achieved = {str(k): str(v) for k, v in hello["hello"].items()}
        dedicated = achieved.get("uid") == "dedicated"
        if achieved.get("pid_namespace") == "yes":
            achieved["kill"] = "pid_namespace"
        else:
            achieved["kill"] = "uid" if dedicated else "process_group"
        achieved["snapshot"] = "root_owned" if dedicated else "best_effort"
        achieved["work_quota"] = self.work_quota
        if self._host.require_isolation and (achieved.get("network") != "netns" or not dedicated):
            raise SandboxError(f"required isolation not achieved: {achieved}")
        return achieved

    def _token(self) -> str:
        return f"{self.id}.{self._generation}"

    async def _crashed(self, child: _Child, started: float) -> CallResult:
        duration = time.perf_counter() - started
        detail = ""
        try:
            ended = await asyncio.wait_for(asyncio.shield(child.exit), EXIT_STATUS_WAIT_S)
        except TimeoutError:
            ended, detail = None, "it closed its channel and was killed"
        await self._discard(child)
        if ended is None:
            return results.crashed(None, duration, detail)
        if os.WIFSIGNALED(ended.status) and ended.cpu_s >= CPU_LIMIT_SHARE * self.limits.cpu_s:
            detail = f"it used its CPU limit of {self.limits.cpu_s} s (RLIMIT_CPU)"
        return results.crashed(ended.status, duration, detail, ended.cpu_s)

    async def _discard(self, child: _Child) -> None:
        """Kill everything of the sandbox and forget `child`; a later call forks a fresh one."""
        try:
            if self._state == "open":
                await self._terminate(child)
        finally:
            self._release(child)

    def _abandon(self, child: _Child) -> None:
        """Synchronous, for a cancelled call: kill the child now; the rest dies before anything runs again."""
        if child.pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
        child.writer.close()
        child.abandoned = True

    def _release(self, child: _Child) -> None:
        if self._child is child:
            self._child = None
        child.writer.close()
        if child.pidfd >= 0:
            os.close(child.pidfd)
            child.pidfd = -1

    async def _terminate(self, child: _Child | None) -> None:
        """Kill every process of this sandbox and wait until none is left; SandboxError if some survive."""
        if child is not None and child.namespace_init and await self._kill_namespace(child):
            self._needs_purge = False
            return
        if child is None and not self._needs_purge:
            return
        pgid = None if self.uid is not None else self._last_pid
        if self.uid is None and pgid is None:
            return
        try:
            zygote = await self._host.zygote()
            await zygote.kill(uid=self.uid, pgid=pgid, token=self._token())
        except SandboxError as exc:
            if not await off_loop(_kill_without_zygote, self.uid, pgid):
                raise SandboxError(f"sandbox {self.id}: processes survived SIGKILL ({exc})") from None
        self._needs_purge = False

    async def _kill_namespace(self, child: _Child) -> bool:
        """SIGKILL the namespace's init; True once the zygote has reaped it, i.e. the namespace is empty."""
        if child.pidfd < 0:
            return False
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
        try:
            ended = await asyncio.wait_for(asyncio.shield(child.exit), KILL_WAIT_S)
        except TimeoutError:
            return False
        return ended is not None


def _kill_without_zygote(uid: int | None, pgid: int | None) -> bool:
    if uid is not None:
        return kill_uid_processes(uid)
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    return True
