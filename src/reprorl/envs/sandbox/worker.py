"""The zygote: a clean interpreter that pre-imports tool code once and forks confined sandboxes from it.

Run as `python -m reprorl.envs.sandbox.worker --fd N` (the pool starts it through `zygote.LEAN_START`,
which leaves `reprorl/__init__.py` unrun until a tool module reads a name from it), where N is a
SOCK_SEQPACKET control socket to the pool. It receives only code to import and requests (spawn, kill,
snapshot), never task data or secrets, so nothing a sandbox inherits from it is worth stealing. Forking
from it costs a few milliseconds where starting an interpreter would cost hundreds. It is a child
subreaper, so orphans of sandboxes are re-parented to it and reaped here rather than piling up as
zombies that would keep counting against their uid's process limit. When the pool goes away (EOF on the
control socket) it kills every sandbox it started and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import selectors
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from reprorl.envs.sandbox import child, confine, mounts, snapshot
from reprorl.envs.sandbox.protocol import CONTROL_MESSAGE_BYTES, decode_control, encode_control

KILL_DEADLINE_S = 10.0
# Modules the standard library imports lazily. A sandbox that dropped to its own uid may be unable
# to read the interpreter's files (e.g. a Python installed under /root) where no private mount
# namespace binds them back in (`mounts.hidden_interpreter_dirs`), so they are imported here.
STDLIB_PRELOAD = (
    "encodings.idna",
    "encodings.ascii",
    "encodings.latin_1",
    "encodings.utf_16",
    "encodings.utf_32",
    "encodings.utf_8_sig",
    "encodings.unicode_escape",
    "encodings.raw_unicode_escape",
)


class Zygote:
    """The zygote's state: its control socket, the sandboxes it forked, and helpers still running."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.children: dict[int, tuple[int | None, str]] = {}  # pid -> (uid, token of its sandbox)
        self.helpers: dict[int, tuple[int, int]] = {}  # pid -> (request id, error pipe read end)
        self.own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY)

    def serve(self) -> None:
        confine.prctl(confine.PR_SET_CHILD_SUBREAPER, 1)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        if not self._init():
            return
        selector = selectors.DefaultSelector()
        selector.register(self.control, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj == wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 4096):
                            pass
                    self._reap()
                elif not self._handle_one():
                    self._shutdown()
                    return

    def _init(self) -> bool:
        message, _ = self._recv()
        if message is None:
            return False
        for entry in message.get("sys_path", []):
            if entry not in sys.path:
                sys.path.append(entry)
        for name in STDLIB_PRELOAD:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        mounts.scratch_dirs()  # resolved once here rather than in every sandbox process
        mounts.hidden_interpreter_dirs()
        tools: dict[str, list[str]] = {}
        errors: dict[str, str] = {}
        for name in message.get("modules", []):
            try:
                module = importlib.import_module(name)
            except BaseException as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            tools[name] = sorted(attr for attr, value in vars(module).items() if callable(value))
        self._send({"op": "ready", "pid": os.getpid(), "tools": tools, "errors": errors})
        return True

    def _recv(self) -> tuple[dict[str, Any] | None, list[int]]:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.control, CONTROL_MESSAGE_BYTES, 4)
        except ConnectionResetError:
            # The pool closed its end with our replies unread (its process was killed): as gone as
            # at EOF, and its sandboxes must be stopped all the same.
            return None, []
        if not data:
            for fd in fds:
                os.close(fd)
            return None, []
        return decode_control(data), fds

    def _send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the pool is gone; EOF on the next read ends the loop
            self.control.sendall(encode_control(message))

    def _handle_one(self) -> bool:
        message, fds = self._recv()
        if message is None:
            return False
        op, rid = message.get("op"), int(message.get("id", 0))
        try:
            if op == "spawn" and len(fds) == 1:
                pid = self._spawn(fds.pop(), message["spec"])
                self._send({"op": "reply", "id": rid, "ok": True, "pid": pid})
            elif op == "kill":
                self._kill(rid, message)
            elif op == "snapshot":
                self._start_helper(rid, snapshot.take, message)
            else:
                self._send({"op": "reply", "id": rid, "ok": False, "error": f"bad request {op!r}"})
        except Exception as exc:
            self._send({"op": "reply", "id": rid, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def _spawn(self, channel_fd: int, spec: dict[str, Any]) -> int:
        new_namespace = bool(spec["pid_namespace"]) and confine.new_pid_namespace_for_children()
        failure: OSError | None = None
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(channel_fd)
            pid, failure = -1, exc
        if pid == 0:
            child.run(channel_fd, spec)  # never returns
        if new_namespace:
            try:
                confine.restore_pid_namespace_for_children(self.own_pid_namespace)
            except OSError:
                # Every later sandbox would be born into this one's namespace; the pool restarts us.
                os._exit(1)
        if failure is not None:
            raise failure
        os.close(channel_fd)
        self.children[pid] = (spec["uid"], spec["token"])
        return pid

    def _kill(self, rid: int, message: dict[str, Any]) -> None:
        pgid = message.get("pgid")
        if pgid is not None and pgid in self.children and self.children[pgid][1] != message.get("token"):
            # That pid now belongs to another sandbox, so the group asked for is already empty.
            message = {**message, "pgid": None}
        self._start_helper(rid, _kill_helper, message)

    def _start_helper(self, rid: int, body: Any, message: dict[str, Any]) -> None:
        """Run `body(message)` in a forked process; its error text comes back through a pipe."""
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                # A helper may become a sandbox uid: it keeps nothing of the zygote's but its error pipe.
                os.closerange(3, err_w)
                os.closerange(err_w + 1, 1 << 20)
                problem = body(message)
                if problem:
                    os.write(err_w, problem.encode()[:4000])
                else:
                    code = 0
            except BaseException as exc:
                with contextlib.suppress(BaseException):
                    os.write(err_w, f"{type(exc).__name__}: {exc}".encode()[:4000])
            finally:
                os._exit(code)
        os.close(err_w)
        self.helpers[pid] = (rid, err_r)

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                del self.children[pid]
                cpu_s = usage.ru_utime + usage.ru_stime
                self._send({"op": "exit", "pid": pid, "status": status, "cpu_s": cpu_s})
            elif pid in self.helpers:
                rid, err_r = self.helpers.pop(pid)
                os.set_blocking(err_r, False)
                try:
                    error = os.read(err_r, 4096).decode(errors="replace")
                except BlockingIOError:
                    error = ""
                os.close(err_r)
                ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
                if not ok and not error:
                    error = f"helper ended with status {status}"
                self._send({"op": "reply", "id": rid, "ok": ok, "error": None if ok else error})

    def _shutdown(self) -> None:
        """The pool is gone: nothing it started may outlive it."""
        for pid in self.children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        for uid in {uid for uid, _token in self.children.values() if uid is not None}:
            helper = os.fork()
            if helper == 0:
                try:
                    confine.kill_all_of_uid(uid, KILL_DEADLINE_S)
                finally:
                    os._exit(0)
            # Keep reaping while the helper works: it waits until no zombie of the uid is left.
            while True:
                try:
                    if os.waitpid(-1, 0)[0] == helper:
                        break
                except ChildProcessError:
                    break


def _kill_helper(message: dict[str, Any]) -> str | None:
    uid, pgid = message.get("uid"), message.get("pgid")
    if pgid is not None and not confine.kill_process_group(pgid, KILL_DEADLINE_S):
        return f"process group {pgid} survived SIGKILL"
    if uid is not None and not confine.kill_all_of_uid(uid, KILL_DEADLINE_S):
        return f"processes of uid {uid} survived SIGKILL"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="reprorl sandbox zygote (started by SandboxPool)")
    parser.add_argument("--fd", type=int, required=True, help="the SOCK_SEQPACKET control socket")
    args = parser.parse_args(argv)
    # Relative sys.path entries would resolve against whatever directory a sandbox is in.
    sys.path[:] = [p for p in sys.path if p and Path(p).is_absolute()]
    control = socket.socket(fileno=args.fd)
    Zygote(control).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
