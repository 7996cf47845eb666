"""A sandbox process: confines itself right after the zygote forks it, then serves tool calls.

Everything here runs in the forked child. Setup happens before any untrusted code, so the hello
frame it sends (what isolation was achieved) can be believed; after that the process runs tools
on behalf of the model and the pool trusts nothing it says.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from reprorl.envs.sandbox import confine, mounts, readonly
from reprorl.envs.sandbox.context import ToolContext
from reprorl.envs.sandbox.protocol import encode, recv_frame
from reprorl.envs.sandbox.result import MAX_ERROR_CHARS, MAX_ERROR_TYPE_CHARS

CHANNEL_FD = 3


def run(channel_fd: int, spec: dict[str, Any]) -> None:
    """Confine this process as `spec` says, then serve calls until the pool closes the channel."""
    status = 70
    try:
        # Resolved while the host's view still stands: a link on these paths may lead through a
        # directory that the private mounts cover.
        spec = {**spec, **{key: os.path.realpath(spec[key]) for key in ("dir", "workdir", "snapshot_dir")}}
        channel = _confine(channel_fd, spec)
        status = 0
        _serve(channel, spec)
    except BaseException:
        status = status or 71
    finally:
        os._exit(status)


def _confine(channel_fd: int, spec: dict[str, Any]) -> socket.socket:
    os.setsid()
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    # The only descriptors a sandbox keeps are /dev/null on 0-2 and its own channel: never the
    # zygote's control socket, which would let it order forks.
    if channel_fd != CHANNEL_FD:
        os.dup2(channel_fd, CHANNEL_FD)
    os.closerange(CHANNEL_FD + 1, 1 << 20)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    channel = socket.socket(fileno=CHANNEL_FD)
    try:
        isolation = _isolate(spec)
    except BaseException as exc:
        channel.sendall(encode({"setup_error": f"{type(exc).__name__}: {exc}"}))
        raise
    channel.sendall(encode({"hello": isolation, "pid": os.getpid()}))
    return channel


def _isolate(spec: dict[str, Any]) -> dict[str, str]:
    network = "none"
    if spec["network"] and confine.unshare_network():
        network = "netns"
    namespace_init = os.getpid() == 1
    # Mounting needs the privileges that the uid drop below gives up.
    tmp_bytes = int(spec["limits"]["tmp_bytes"])
    private = mounts.make_private(spec["dir"], tmp_bytes, own_pid_namespace=namespace_init)
    host_fs = "writable"
    if private != "shared":
        host_fs = readonly.read_only_host([spec["workdir"], *mounts.scratch_dirs()])
    confine.apply_rlimits(spec["limits"], namespace_init=namespace_init)
    uid, gid = spec["uid"], spec["gid"]
    if uid is not None:
        confine.drop_to(uid, gid)
    if spec["network"] and network == "none" and confine.unshare_network_unprivileged():
        network = "netns"
    no_new_privs = confine.prctl(confine.PR_SET_NO_NEW_PRIVS, 1)
    workdir = spec["workdir"]
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(HOME=workdir, TMPDIR=workdir, PATH="/usr/local/bin:/usr/bin:/bin", LANG="C.UTF-8")
    tempfile.tempdir = None
    return {
        "network": network,
        "ipc": "ipcns" if network == "netns" else "none",
        "uid": "dedicated" if uid is not None else "shared",
        "pid_namespace": "yes" if namespace_init else "no",
        "no_new_privs": "yes" if no_new_privs else "no",
        "mounts": private,
        "host_fs": host_fs,
    }


def _serve(channel: socket.socket, spec: dict[str, Any]) -> None:
    workdir, snapshot = Path(spec["workdir"]), Path(spec["snapshot_dir"])
    cap = int(spec["limits"]["max_output_chars"])
    namespace_init = os.getpid() == 1
    while True:
        if namespace_init:
            _reap_orphans()
        request = recv_frame(channel)
        if request is None:
            return
        use_snapshot = bool(request.get("snapshot"))
        ctx = ToolContext(root=snapshot if use_snapshot else workdir, snapshot=use_snapshot)
        reply = _call(request["fn"], request["kwargs"], ctx, cap)
        reply["id"] = request["id"]
        try:
            frame = encode(reply)
        except MemoryError:
            frame = encode({"id": request["id"], **_failure(MemoryError("the result could not be encoded"))})
        channel.sendall(frame)


def _reap_orphans() -> None:
    """As its namespace's init this process inherits every orphan; their zombies would hold process slots."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _call(fn_ref: str, kwargs: dict[str, Any], ctx: ToolContext, cap: int) -> dict[str, Any]:
    try:
        os.chdir(ctx.root)
        module_name, _, attr = fn_ref.partition(":")
        fn = getattr(sys.modules[module_name], attr)
        value = fn(ctx, **kwargs)
        if not isinstance(value, str):
            raise TypeError(f"{fn_ref} returned {type(value).__name__}, not str")
        return {"ok": True, "value": value[:cap], "output_chars": len(value)}
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are the tool's failures too
        return _failure(exc)


def _failure(exc: BaseException) -> dict[str, Any]:
    try:
        message = str(exc)
    except BaseException:
        message = "<the exception's message could not be rendered>"
    return {
        "ok": False,
        "value": "",
        "output_chars": 0,
        "error_type": type(exc).__name__[:MAX_ERROR_TYPE_CHARS],
        "error": message[:MAX_ERROR_CHARS],
    }
