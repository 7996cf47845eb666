"""Confinement of a sandbox process: no network, kernel resource limits, a dedicated unprivileged uid.

Each function is one step a freshly forked sandbox process applies to itself, and reports what it
actually achieved, so a pool that cannot get full isolation (not root, no namespaces) degrades to
what the kernel allows and says so instead of pretending.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
# SysV IPC and POSIX message queues are keyed per IPC namespace: without their own, two sandboxes
# could meet in a shared memory segment.
PRIVATE_NAMESPACES = CLONE_NEWNET | CLONE_NEWIPC
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

ZOMBIE_GRACE_S = 0.2

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> bool:
    return bool(_libc.prctl(option, value, 0, 0, 0) == 0)


def new_pid_namespace_for_children() -> bool:
    """Make this process's next child the init of a new PID namespace (needs CAP_SYS_ADMIN).

    When that init dies the kernel kills every process of its namespace and reaps them before its
    parent hears of the death, so one SIGKILL ends a sandbox with all its orphans, exactly.
    """
    return bool(_libc.unshare(CLONE_NEWPID) == 0)


def restore_pid_namespace_for_children(own_namespace_fd: int) -> None:
    """Undo `new_pid_namespace_for_children` so later children are born in our own namespace."""
    if _libc.setns(own_namespace_fd, CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "setns(CLONE_NEWPID) failed")


def unshare_network() -> bool:
    """Enter new network and IPC namespaces (only a loopback, and it is down); needs CAP_SYS_ADMIN."""
    return bool(_libc.unshare(PRIVATE_NAMESPACES) == 0)


def unshare_network_unprivileged() -> bool:
    """The same through a new user namespace, which an unprivileged process may create.

    Only our own ids are mapped into it, so files keep their real owner and the capabilities the
    namespace grants reach nothing outside it. Mapping can be refused (e.g. after a setuid made the
    process non-dumpable); the network namespace stands either way.
    """
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(CLONE_NEWUSER | PRIVATE_NAMESPACES) != 0:
        return False
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            Path(f"/proc/self/{name}").write_text(text)
        except OSError:
            break
    return True


def apply_rlimits(limits: Mapping[str, Any], *, namespace_init: bool) -> None:
    """Apply the sandbox's rlimits; without privilege a request above the hard limit is clamped to it.

    A PID namespace's init ignores SIGXCPU, so there the CPU limit is enforced by the hard limit's
    SIGKILL at the same number of seconds; elsewhere SIGXCPU comes first, with a second of grace.
    """
    address_space = _vm_size_bytes() + int(limits["memory_bytes"])
    cpu = int(limits["cpu_s"])
    wanted = (
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_CPU, cpu, cpu if namespace_init else cpu + 1),
        (resource.RLIMIT_AS, address_space, address_space),
        (resource.RLIMIT_NPROC, int(limits["processes"]), int(limits["processes"])),
        (resource.RLIMIT_FSIZE, int(limits["file_bytes"]), int(limits["file_bytes"])),
        (resource.RLIMIT_NOFILE, int(limits["open_files"]), int(limits["open_files"])),
    )
    privileged = os.geteuid() == 0
    for which, soft, hard in wanted:
        if not privileged:
            _, current_hard = resource.getrlimit(which)
            if current_hard != resource.RLIM_INFINITY:
                hard = min(hard, current_hard)
                soft = min(soft, hard)
        resource.setrlimit(which, (soft, hard))
    # Writing past RLIMIT_FSIZE must fail with EFBIG inside the tool, not kill the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def drop_to(uid: int, gid: int) -> None:
    """Become `uid`/`gid` for good (real, effective and saved), with no supplementary groups."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise PermissionError(f"could not switch to uid {uid} / gid {gid}")


def kill_all_of_uid(uid: int, deadline_s: float) -> bool:
    """In a throwaway process: become `uid` and SIGKILL every process of it until none is left.

    kill(-1) signals exactly the processes this uid may signal, atomically with respect to fork, so
    double-forked orphans and fork bombs die too. Its return value cannot tell whether any were
    left (it succeeds whenever other processes exist at all), so the kernel's per-user process
    count answers instead: with RLIMIT_NPROC at 2, a fork succeeds only while this process is the
    uid's only one. Zombies count until reaped, so True also means no process slot is held.
    """
    os.setresuid(uid, uid, uid)
    resource.setrlimit(resource.RLIMIT_NPROC, (2, 2))
    started = time.monotonic()
    pause = 0.0002
    while True:
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)
        if _alone_in_uid():
            return True
        waited = time.monotonic() - started
        # Zombies whose reaper is not the zygote (it died, and they went to init) can linger; they
        # run nothing, so after a grace period a scan that finds only them is good enough.
        if waited > ZOMBIE_GRACE_S and uid_processes(uid) == [os.getpid()]:
            return True
        if waited > deadline_s:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def _alone_in_uid() -> bool:
    try:
        pid = os.fork()
    except BlockingIOError:
        return False
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return True


def real_uid(pid: int) -> int | None:
    """The real uid of a live process; None for a zombie or a pid that is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    uid = None
    for line in status.splitlines():
        if line.startswith("State:") and line.split()[1] == "Z":
            return None
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
    return uid


def uid_processes(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is `uid`."""
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and real_uid(int(e.name)) == uid]


def kill_process_group(pgid: int, deadline_s: float) -> bool:
    """SIGKILL a process group until it is gone (the fallback when the sandbox shares our uid)."""
    deadline = time.monotonic() + deadline_s
    pause = 0.0002
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def _vm_size_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_bytes().split()[0])
    return pages * os.sysconf("SC_PAGE_SIZE")
