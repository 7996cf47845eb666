"""The sandbox pool: one zygote per pool, and the sandboxes it opens, each under its own uid.

    async with SandboxPool(["reprorl.envs.families.calculator"]) as pool:
        async with pool.open() as sandbox:
            result = await sandbox.call("reprorl.envs.families.calculator:calc", {"expression": "1+1"})

Opening a sandbox forks it from the zygote (a few milliseconds, no new interpreter). Isolation is
as strong as the process's privileges allow: run as root to get a dedicated uid per sandbox (so
RLIMIT_NPROC holds and root-only files stay unreadable), a network namespace, and private /tmp,
/var/tmp, /dev/shm and /proc (see `mounts.py`); otherwise each sandbox records the weaker isolation
it actually got in `Sandbox.isolation`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import os
from collections.abc import Generator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from reprorl.envs.sandbox.errors import SandboxError
from reprorl.envs.sandbox.layout import (
    UidSlot,
    UidSlots,
    create_dirs,
    default_root,
    default_uid_lock_dir,
    prepare_root,
    reap_sandboxes,
    remove_sandbox_dir,
)
from reprorl.envs.sandbox.limits import SandboxLimits
from reprorl.envs.sandbox.quota import bound_work
from reprorl.envs.sandbox.sandbox import Sandbox
from reprorl.envs.sandbox.zygote import ZygoteClient
from reprorl.threads import off_loop

DEFAULT_UID_BASE = 2_000_000
DEFAULT_MAX_SANDBOXES = 4096


def module_roots(modules: Sequence[str]) -> list[str]:
    """The import roots this process finds `modules` under (for `a.b.c` in `/r/a/b/c.py`, `/r`)."""
    roots: list[str] = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue  # the zygote fails to import it and says so, naming the module
        if found is None or not found.has_location or not found.origin:
            continue
        depth = name.count(".") + (found.submodule_search_locations is not None)
        roots.append(str(Path(found.origin).resolve().parents[depth]))
    return roots


class SandboxPool:
    """Opens sandboxes that run functions of `modules`, forked from one pre-imported zygote."""

    def __init__(
        self,
        modules: Sequence[str] = (),
        *,
        sys_path: Sequence[str | Path] = (),
        root: str | Path | None = None,
        limits: SandboxLimits | None = None,
        dedicated_uids: bool = True,
        network: bool = True,
        pid_namespaces: bool = True,
        require_isolation: bool = False,
        uid_base: int = DEFAULT_UID_BASE,
        max_sandboxes: int = DEFAULT_MAX_SANDBOXES,
        uid_lock_dir: str | Path | None = None,
        warm: int = 0,
    ) -> None:
        """
        Args:
            modules: Tool modules the zygote imports once; only their functions can be called.
            sys_path: Extra import paths for those modules (absolute; made absolute if not). The
                folders this process finds the modules under are added anyway, so a module is
                found wherever it is installed (a script's folder, site-packages, a checkout).
            root: Where sandbox directories live (default `$REPRORL_SANDBOX_ROOT`, else
                `/tmp/reprorl-sandboxes`); every directory above it must be traversable by others.
            limits: Default limits of each sandbox; `open(limits=...)` overrides them per sandbox.
            dedicated_uids: Give each sandbox its own uid when running as root.
            network: Put each sandbox in an empty network namespace (no network) when the kernel allows.
            pid_namespaces: Make each sandbox process the init of its own PID namespace when root, so
                killing it kills everything it started.
            require_isolation: Refuse to open a sandbox without a dedicated uid and a network namespace.
            uid_base: First dedicated uid; the pool uses `uid_base .. uid_base + max_sandboxes - 1`.
            max_sandboxes: How many sandboxes may be open at once (dedicated uids available).
            uid_lock_dir: Where uid slot locks live; shared by every pool on the machine.
            warm: Sandboxes of the default limits kept opened ahead of demand: their directory, uid,
                namespaces, mounts and limits are set up and their process waits for its first call,
                so an `open()` takes one at once and the pool opens the next in the background.
                Each is still used by one episode only; one whose process died while it waited is
                closed, never handed out. 0 opens every sandbox on demand.
        """
        if warm < 0:
            raise ValueError(f"warm must be >= 0, not {warm}")
        self.modules = tuple(modules)
        given = [str(Path(p).resolve()) for p in sys_path]
        self.sys_path = tuple(dict.fromkeys([*given, *module_roots(self.modules)]))
        self.root = Path(root) if root is not None else default_root()
        self.limits = limits or SandboxLimits()
        self.network = network
        self.pid_namespaces = pid_namespaces
        self.require_isolation = require_isolation
        self.dedicated_uids = dedicated_uids and os.geteuid() == 0
        self.zygote_restarts = 0
        self.reaped = 0
        self._slots = UidSlots(
            uid_base, max_sandboxes, Path(uid_lock_dir) if uid_lock_dir else default_uid_lock_dir()
        )
        self._zygote: ZygoteClient | None = None
        self._zygote_lock = asyncio.Lock()
        self._sandboxes: set[Sandbox] = set()
        self._started = False
        self._closed = False
        self.warm = warm
        self.warm_failures = 0  # background opens that failed (the next open() opens on demand)
        self._reserve: collections.deque[Sandbox] = collections.deque()
        self._filling: set[asyncio.Task[None]] = set()

    async def start(self) -> SandboxPool:
        """Prepare the root, reap sandboxes of dead pools, and start the zygote."""
        if self._started:
            return self
        prepare_root(self.root)
        self.reaped = await off_loop(reap_sandboxes, self.root, self._slots.lock_dir)
        self._zygote = ZygoteClient(self.modules, self.sys_path)
        await self._zygote.start()
        self._started = True
        self._top_up()
        return self

    def open(self, *, limits: SandboxLimits | None = None) -> OpeningSandbox:
        """A new sandbox: `sandbox = await pool.open()` or `async with pool.open() as sandbox:`."""
        return OpeningSandbox(self, limits or self.limits)

    @property
    def open_sandboxes(self) -> int:
        """Sandboxes whose process and directory exist now, the warm ones waiting included."""
        return len(self._sandboxes)

    @property
    def warm_sandboxes(self) -> int:
        """Sandboxes opened ahead of demand and waiting for an episode."""
        return len(self._reserve)

    async def aclose(self) -> None:
        """Close every open sandbox, then stop the zygote."""
        if self._closed:
            return
        self._closed = True
        for task in self._filling:
            task.cancel()
        await asyncio.gather(*self._filling, return_exceptions=True)
        self._reserve.clear()
        outcomes = await asyncio.gather(*(s.close() for s in list(self._sandboxes)), return_exceptions=True)
        if self._zygote is not None:
            await self._zygote.stop()
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise SandboxError(f"{len(failures)} sandbox(es) failed to close: {failures[0]}")

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- what sandboxes use (SandboxHost) ---------------------------------------------------------

    async def zygote(self) -> ZygoteClient:
        """The running zygote, restarted first if it died."""
        current = self._zygote
        if current is not None and current.alive:
            return current
        async with self._zygote_lock:
            if self._closed or not self._started:
                raise SandboxError("the sandbox pool is not running")
            if self._zygote is not None and self._zygote.alive:
                return self._zygote
            if self._zygote is not None:
                await self._zygote.stop()
            fresh = ZygoteClient(self.modules, self.sys_path)
            await fresh.start()
            self._zygote = fresh
            self.zygote_restarts += 1
            return fresh

    def tools(self) -> dict[str, frozenset[str]]:
        return self._zygote.tools if self._zygote is not None else {}

    def release(self, sandbox: Sandbox, slot: UidSlot | None, *, clean: bool) -> None:
        self._sandboxes.discard(sandbox)
        if slot is not None:
            self._slots.release(slot, clean=clean)

    async def _open(self, limits: SandboxLimits) -> Sandbox:
        if self._closed or not self._started:
            raise SandboxError("the sandbox pool is not running; use `async with SandboxPool(...)`")
        if limits == self.limits:
            while self._reserve:
                sandbox = self._reserve.popleft()
                self._top_up()
                if sandbox.waiting:
                    return sandbox
                with contextlib.suppress(SandboxError):
                    await sandbox.close()  # its process died while it waited: never handed out
        return await self._open_now(limits)

    def _top_up(self) -> None:
        """Start background opens until `warm` sandboxes are waiting or being opened."""
        while not self._closed and len(self._reserve) + len(self._filling) < self.warm:
            task = asyncio.get_running_loop().create_task(self._fill())
            self._filling.add(task)
            task.add_done_callback(self._filling.discard)

    async def _fill(self) -> None:
        try:
            sandbox = await self._open_now(self.limits)
        except (SandboxError, OSError):
            self.warm_failures += 1  # e.g. no uid free: the next open() opens on demand and says why
            return
        if self._closed:
            with contextlib.suppress(SandboxError):
                await sandbox.close()
            return
        self._reserve.append(sandbox)

    async def _open_now(self, limits: SandboxLimits) -> Sandbox:
        slot = self._slots.acquire() if self.dedicated_uids else None
        try:
            sandbox_id, dirs = create_dirs(self.root, slot)
            quota = bound_work(dirs.work, limits, slot.uid if slot else None, slot.gid if slot else None)
        except BaseException:
            if slot is not None:
                self._slots.release(slot, clean=not slot.needs_purge)
            raise
        sandbox = Sandbox(self, sandbox_id, dirs, slot, limits, work_quota=quota)
        self._sandboxes.add(sandbox)
        try:
            await sandbox.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await sandbox.close()
            if dirs.base.exists():
                await off_loop(remove_sandbox_dir, dirs.base)
            raise
        return sandbox


class OpeningSandbox:
    """`pool.open()`: await it (then close the sandbox yourself) or use it as an async context manager."""

    def __init__(self, pool: SandboxPool, limits: SandboxLimits) -> None:
        self._pool = pool
        self._limits = limits
        self._sandbox: Sandbox | None = None

    def __await__(self) -> Generator[Any, None, Sandbox]:
        return self._pool._open(self._limits).__await__()

    async def __aenter__(self) -> Sandbox:
        self._sandbox = await self._pool._open(self._limits)
        return self._sandbox

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._sandbox is not None:
            await self._sandbox.close()
