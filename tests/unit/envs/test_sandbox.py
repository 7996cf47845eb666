"""The sandbox: calls, files, isolation between sandboxes, timeouts, crashes, snapshots, reaping."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_support import (
    IS_ROOT,
    TOOLS,
    TOOLS_DIR,
    LoopThread,
    needs_root,
    running_pool,
    sandbox_root,
    uid_processes,
)

from reprorl.envs.sandbox import (
    CallResult,
    SandboxError,
    SandboxLimits,
    SandboxPool,
    UnknownToolError,
    mounts,
    reap_sandboxes,
)
from reprorl.envs.sandbox.layout import process_start_ticks


@pytest.fixture(scope="module")
def runner() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


@pytest.fixture(scope="module")
def pool(runner: LoopThread) -> Iterator[SandboxPool]:
    with running_pool(runner) as p:
        yield p


def call(runner: LoopThread, sandbox: object, fn: str, timeout: float = 60.0, **kwargs: object) -> CallResult:
    result: CallResult = runner.run(sandbox.call(f"{TOOLS}:{fn}", kwargs), timeout)  # type: ignore[attr-defined]
    return result


def test_a_call_returns_the_tools_string(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> tuple[CallResult, dict[str, object]]:
        async with pool.open() as sandbox:
            return await sandbox.call(f"{TOOLS}:echo", {"text": "héllo"}), sandbox.info()

    result, info = runner.run(go())
    assert result.ok and result.value == "héllo" and result.output_chars == 5
    assert result.error_type is None and not result.timed_out and not result.crashed
    assert 0 < result.duration_s < 5
    json.dumps(info)  # the trajectory stores it as JSON
    assert info["limits"] == SandboxLimits().model_dump()
    assert set(info) == {"id", "dir", "uid", "limits", "isolation", "restarts"}
    assert info["isolation"]["mounts"] == ("private_tmp_proc" if IS_ROOT else "shared")  # type: ignore[index]


def test_a_tool_exception_is_data_not_an_exception(runner: LoopThread, pool: SandboxPool) -> None:
    sandbox = runner.run(pool.open())
    try:
        failed = call(runner, sandbox, "fail", message="boom")
        assert not failed.ok and failed.error_type == "ValueError" and failed.error == "boom"
        assert not failed.crashed and not failed.timed_out
        wrong = call(runner, sandbox, "not_a_string")
        assert wrong.error_type == "TypeError" and "returned int" in (wrong.error or "")
        exited = call(runner, sandbox, "run_python", code="raise SystemExit(3)")
        assert exited.error_type == "SystemExit" and not exited.crashed
        assert call(runner, sandbox, "echo", text="still here").value == "still here"
        assert sandbox.restarts == 0
    finally:
        runner.run(sandbox.close())


def test_unknown_functions_are_refused_before_anything_runs(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> None:
        async with pool.open() as sandbox:
            for ref in (f"{TOOLS}:no_such_tool", "os:system", "sandbox_tools", ""):
                with pytest.raises(UnknownToolError):
                    await sandbox.call(ref, {})
            with pytest.raises(TypeError):
                await sandbox.call(f"{TOOLS}:echo", {"text": object()})

    runner.run(go())


def test_files_persist_across_calls_in_the_work_dir(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> None:
        async with pool.open() as sandbox:
            assert (await sandbox.call(f"{TOOLS}:write", {"path": "notes.txt", "text": "kept"})).ok
            assert (await sandbox.call(f"{TOOLS}:read", {"path": "notes.txt"})).value == "kept"
            assert (sandbox.workdir / "notes.txt").read_text() == "kept"
            where = (await sandbox.call(f"{TOOLS}:whoami", {})).value.split()
            assert where[-1] == str(sandbox.workdir)

    runner.run(go())


def test_sandboxes_are_isolated_from_each_other(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> None:
        first, second = await pool.open(), await pool.open()
        assert first.dir != second.dir
        if IS_ROOT:
            assert first.uid is not None and first.uid != second.uid
        await first.call(f"{TOOLS}:write", {"path": "secret.txt", "text": "mine"})
        assert (await second.call(f"{TOOLS}:listdir", {})).value == ""
        stolen = await second.call(f"{TOOLS}:read", {"path": str(first.workdir / "secret.txt")})
        if IS_ROOT:
            # The pool root lies in /tmp, of which each sandbox has its own: the neighbour is not there.
            assert stolen.error_type == "FileNotFoundError"
        first_dir = first.dir
        await first.close()
        await second.close()
        assert not first_dir.exists() and not second.dir.exists()
        async with pool.open() as third:
            assert third.dir != first_dir
            assert (await third.call(f"{TOOLS}:listdir", {})).value == ""
            assert not (await third.call(f"{TOOLS}:read", {"path": "secret.txt"})).ok

    runner.run(go())


def test_a_timeout_kills_the_call_and_the_next_call_keeps_the_files(
    runner: LoopThread, pool: SandboxPool
) -> None:
    async def go() -> None:
        async with pool.open() as sandbox:
            await sandbox.call(f"{TOOLS}:write", {"path": "a.txt", "text": "before"})
            old_pid = (await sandbox.call(f"{TOOLS}:whoami", {})).value
            started = time.perf_counter()
            slow = await sandbox.call(f"{TOOLS}:sleep", {"s": 30}, timeout_s=0.3)
            assert slow.timed_out and not slow.ok and slow.error_type == "TimeoutError"
            assert 0.3 <= slow.duration_s < 2 and time.perf_counter() - started < 3
            after = await sandbox.call(f"{TOOLS}:read", {"path": "a.txt"})
            assert after.ok and after.value == "before"
            assert sandbox.restarts == 1 and sandbox.info()["restarts"] == 1
            if sandbox.isolation["pid_namespace"] == "no":
                assert (await sandbox.call(f"{TOOLS}:whoami", {})).value != old_pid

    runner.run(go())


def test_a_crash_is_reported_with_its_signal_and_the_sandbox_respawns(
    runner: LoopThread, pool: SandboxPool
) -> None:
    async def go() -> None:
        async with pool.open() as sandbox:
            await sandbox.call(f"{TOOLS}:write", {"path": "a.txt", "text": "kept"})
            crash = await sandbox.call(f"{TOOLS}:run_python", {"code": "import ctypes; ctypes.string_at(0)"})
            assert crash.crashed and not crash.ok and not crash.timed_out
            assert crash.signal == signal.SIGSEGV and "SIGSEGV" in (crash.error or "")
            exited = await sandbox.call(f"{TOOLS}:run_python", {"code": "import os; os._exit(7)"})
            assert exited.crashed and exited.signal is None and "code 7" in (exited.error or "")
            assert (await sandbox.call(f"{TOOLS}:read", {"path": "a.txt"})).value == "kept"
            assert sandbox.restarts == 2

    runner.run(go())


def test_snapshot_calls_see_the_old_state(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> None:
        async with pool.open() as sandbox:
            with pytest.raises(SandboxError, match="no snapshot"):
                await sandbox.call(f"{TOOLS}:read", {"path": "a.txt"}, use_snapshot=True)
            await sandbox.call(f"{TOOLS}:write", {"path": "a.txt", "text": "v1"})
            await sandbox.take_snapshot()
            await sandbox.call(f"{TOOLS}:write", {"path": "a.txt", "text": "v2"})
            assert (await sandbox.call(f"{TOOLS}:read", {"path": "a.txt"}, use_snapshot=True)).value == "v1"
            assert (await sandbox.call(f"{TOOLS}:read", {"path": "a.txt"})).value == "v2"
            tampered = await sandbox.call(f"{TOOLS}:write", {"path": "a.txt", "text": "x"}, use_snapshot=True)
            assert tampered.error_type == "PermissionError"
            assert (sandbox.snapshot_dir / "a.txt").read_text() == "v1"
            await sandbox.take_snapshot()  # a second snapshot replaces the first
            assert (await sandbox.call(f"{TOOLS}:read", {"path": "a.txt"}, use_snapshot=True)).value == "v2"

    runner.run(go())


@needs_root
def test_a_snapshot_never_copies_what_the_sandbox_could_not_read(
    runner: LoopThread, pool: SandboxPool
) -> None:
    async def go() -> None:
        async with pool.open() as sandbox:
            secret = sandbox.dir / "secret"  # root's, beside work/: in the sandbox's view, not readable
            secret.write_text("root only")
            secret.chmod(0o600)
            plant = (
                "import os, contextlib\n"
                f"os.symlink({str(secret)!r}, 'link')\n"
                "os.symlink('../..', 'up')\n"
                # Refused either way: by the kernel's link protections, or because the work directory
                # is a filesystem of its own (a hard link cannot cross into it).
                "with contextlib.suppress(PermissionError, OSError):\n"
                f"    os.link({str(secret)!r}, 'hard')\n"
                "open('plain.txt', 'w').write('mine')"
            )
            assert (await sandbox.call(f"{TOOLS}:run_python", {"code": plant})).ok
            await sandbox.take_snapshot()
            copied = {p.name: p for p in sandbox.snapshot_dir.rglob("*")}
            assert "link" not in copied and "up" not in copied  # links out of the tree are dropped
            assert (sandbox.snapshot_dir / "plain.txt").read_text() == "mine"
            assert all("root only" not in p.read_text() for p in copied.values() if p.is_file())

    runner.run(go())


def test_long_output_is_cut_in_the_sandbox_and_flagged(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> None:
        async with pool.open(limits=SandboxLimits(max_output_chars=1000)) as sandbox:
            result = await sandbox.call(f"{TOOLS}:big", {"chars": 50_000})
            assert result.ok and len(result.value) == 1000
            assert result.output_chars == 50_000 and result.truncated
            short = await sandbox.call(f"{TOOLS}:big", {"chars": 10})
            assert not short.truncated
        async with pool.open() as sandbox:  # the default cap, 1 MiB, through the real channel
            flood = await sandbox.call(f"{TOOLS}:big", {"chars": 3 * SandboxLimits().max_output_chars})
            assert len(flood.value) == SandboxLimits().max_output_chars and flood.truncated

    runner.run(go())


def test_calls_on_many_sandboxes_run_in_parallel_without_blocking_the_loop(
    runner: LoopThread, pool: SandboxPool
) -> None:
    count, nap = 64, 0.05

    async def go() -> tuple[float, float]:
        sandboxes = await asyncio.gather(*(pool.open() for _ in range(count)))
        gaps: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        started = time.perf_counter()
        results = await asyncio.gather(*(s.call(f"{TOOLS}:sleep", {"s": nap}) for s in sandboxes))
        elapsed = time.perf_counter() - started
        done.set()
        await tick
        await asyncio.gather(*(s.close() for s in sandboxes))
        assert all(r.ok for r in results)
        return elapsed, max(gaps)

    elapsed, worst_gap = runner.run(go(), timeout=120)
    assert elapsed < count * nap / 4, f"{count} calls of {nap}s took {elapsed:.2f}s: they were serialised"
    assert worst_gap < 0.25, f"the event loop stalled for {worst_gap * 1000:.0f} ms"
    assert pool.open_sandboxes == 0


def test_calls_on_one_sandbox_are_serialised(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> float:
        async with pool.open() as sandbox:
            started = time.perf_counter()
            await asyncio.gather(*(sandbox.call(f"{TOOLS}:sleep", {"s": 0.1}) for _ in range(3)))
            return time.perf_counter() - started

    assert runner.run(go()) >= 0.3


def test_a_cancelled_call_leaves_a_usable_sandbox(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> None:
        async with pool.open() as sandbox:
            await sandbox.call(f"{TOOLS}:write", {"path": "a.txt", "text": "kept"})
            task = asyncio.create_task(sandbox.call(f"{TOOLS}:sleep", {"s": 30}))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await sandbox.call(f"{TOOLS}:read", {"path": "a.txt"})).value == "kept"
            assert sandbox.restarts == 1

    runner.run(go())


def test_garbage_on_the_channel_is_a_protocol_violation(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> None:
        async with pool.open() as sandbox:
            huge = "import os; os.write(3, (2**31).to_bytes(4, 'big')); import time; time.sleep(5)"
            result = await sandbox.call(f"{TOOLS}:run_python", {"code": huge})
            assert result.crashed and result.error_type == "SandboxProtocolError" and result.duration_s < 3
            forged = (
                "import os, json; body = json.dumps({'id': 999, 'ok': True, 'value': 'forged'}).encode();"
                "os.write(3, len(body).to_bytes(4, 'big') + body); import time; time.sleep(5)"
            )
            result = await sandbox.call(f"{TOOLS}:run_python", {"code": forged})
            assert result.error_type == "SandboxProtocolError" and result.value == ""
            assert (await sandbox.call(f"{TOOLS}:echo", {"text": "ok"})).value == "ok"

    runner.run(go())


def test_a_frozen_or_closed_sandbox_refuses_calls(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> None:
        sandbox = await pool.open()
        await sandbox.call(f"{TOOLS}:write", {"path": "a.txt", "text": "final"})
        await sandbox.freeze()
        assert (sandbox.workdir / "a.txt").read_text() == "final"  # the verifier reads this
        with pytest.raises(SandboxError, match="frozen"):
            await sandbox.call(f"{TOOLS}:echo", {"text": "x"})
        await sandbox.close()
        await sandbox.close()
        with pytest.raises(SandboxError, match="closed"):
            await sandbox.call(f"{TOOLS}:echo", {"text": "x"})

    runner.run(go())


def test_freezing_during_a_call_ends_the_call_and_everything_it_started(
    runner: LoopThread, pool: SandboxPool
) -> None:
    async def go() -> tuple[CallResult, float]:
        sandbox = await pool.open()
        try:
            call = asyncio.create_task(sandbox.call(f"{TOOLS}:sleep", {"s": 30}))
            await asyncio.sleep(0.2)
            started = time.perf_counter()
            await sandbox.freeze()
            frozen_in = time.perf_counter() - started
            if sandbox.uid is not None:
                assert uid_processes(sandbox.uid) == []
            return await call, frozen_in
        finally:
            await sandbox.close()

    result, frozen_in = runner.run(go())
    assert result.crashed and not result.ok
    assert frozen_in < 2


def test_closing_the_pool_closes_its_sandboxes(runner: LoopThread) -> None:
    with running_pool(runner) as pool:
        sandboxes = [runner.run(pool.open()) for _ in range(2)]
        runner.run(sandboxes[0].call(f"{TOOLS}:sleep", {"s": 0.01}))
    for sandbox in sandboxes:
        assert not sandbox.dir.exists()
        if sandbox.uid is not None:
            assert uid_processes(sandbox.uid) == []
    with pytest.raises(SandboxError, match="closed"):
        runner.run(sandboxes[1].call(f"{TOOLS}:echo", {"text": "x"}))


def test_the_zygote_never_runs_the_public_apis_init_and_serves_its_names_one_module_each(
    runner: LoopThread,
) -> None:
    with running_pool(runner) as pool:
        sandbox = runner.run(pool.open())
        # The package's own __init__ (and the store it imports) never ran: forks stay small.
        assert call(runner, sandbox, "loaded", name="reprorl.store").value == "False"
        assert call(runner, sandbox, "loaded", name="reprorl.envs.sandbox.child").value == "True"
    with sandbox_root() as root:
        public = SandboxPool(["public_api_tools"], sys_path=[TOOLS_DIR], root=root)
        runner.run(public.start())
        try:
            sandbox = runner.run(public.open())
            result = runner.run(sandbox.call("public_api_tools:train_split", {}))
            assert result.ok and result.value == "train"
            # `from reprorl import Split` imported reprorl.types alone: the store (SQLAlchemy) and
            # the rest of the public API stayed out of the zygote.
            for name, expected in (
                ("reprorl.types", "True"),
                ("reprorl.store", "False"),
                ("sqlalchemy", "False"),
            ):
                loaded = runner.run(sandbox.call("public_api_tools:loaded", {"name": name}))
                assert loaded.value == expected, name
        finally:
            runner.run(public.aclose())


def test_a_warm_pool_hands_out_opened_sandboxes_once_each_and_refills(runner: LoopThread) -> None:
    async def settle(pool: SandboxPool) -> None:
        for _ in range(600):
            if pool.warm_sandboxes == pool.warm:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{pool.warm_sandboxes} of {pool.warm} warm sandboxes after 30 s")

    with running_pool(runner, warm=2) as pool:
        runner.run(settle(pool))
        waiting = set(pool._reserve)
        first = runner.run(pool.open())
        assert first in waiting and first.waiting  # set up before it was asked for
        assert call(runner, first, "echo", text="hi").value == "hi" and not first.waiting
        second = runner.run(pool.open())
        assert second in waiting and second is not first
        runner.run(settle(pool))  # refilled in the background
        assert not waiting & set(pool._reserve)  # never handed out twice
        # Other limits than the pool's are opened on demand, never from the warm ones.
        other = runner.run(pool.open(limits=SandboxLimits(cpu_s=3)))
        assert other not in waiting and other.limits.cpu_s == 3 and pool.warm_sandboxes == 2
        # A warm sandbox whose process died while it waited is closed, not handed out.
        doomed = pool._reserve[0]
        os.kill(doomed._child.pid, signal.SIGKILL)  # type: ignore[union-attr]
        runner.run(asyncio.wait_for(asyncio.shield(doomed._child.exit), 10))  # type: ignore[union-attr]
        third = runner.run(pool.open())
        assert third is not doomed and not doomed.dir.exists() and third.waiting
        warm = list(pool._reserve)
        for sandbox in (first, second, other, third):
            runner.run(sandbox.close())
    for sandbox in warm:  # closing the pool closes the waiting ones too
        assert not sandbox.dir.exists()
        if sandbox.uid is not None:
            assert uid_processes(sandbox.uid) == []


@needs_root
def test_a_killed_pool_takes_its_sandboxes_with_it_and_leaves_a_dir_to_reap() -> None:
    script = (
        "import asyncio, sys\n"
        "from reprorl.envs.sandbox import SandboxPool\n"
        "async def main():\n"
        f"    async with SandboxPool([{TOOLS!r}], sys_path=[{str(TOOLS_DIR)!r}], root=sys.argv[1]) as pool:\n"
        "        box = await pool.open()\n"
        "        await box.call('sandbox_tools:run_python', {'code': 'import os\\nif os.fork() == 0:\\n"
        "    os.setsid()\\n    import time; time.sleep(60)'})\n"
        "        print(box.uid, box.dir, (await pool.zygote()).pid, flush=True)\n"
        "        await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    with sandbox_root() as root:
        owner = subprocess.Popen([sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True)
        try:
            assert owner.stdout is not None
            uid_text, box_dir, zygote_pid = owner.stdout.readline().split()
            uid = int(uid_text)
            zygote = os.pidfd_open(int(zygote_pid))  # the owner still runs, so this pid is its zygote
            deadline = time.monotonic() + 5
            while len(uid_processes(uid)) != 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            found = uid_processes(uid)
            assert len(found) == 2, f"expected the sandbox process and its orphan, found {found}"
        finally:
            owner.kill()
            owner.wait()
        # The zygote kills through a helper that itself runs as the uid, so the uid is empty only once
        # the zygote, which waits for its helper, has exited.
        try:
            exited, _, _ = select.select([zygote], [], [], 15)
        finally:
            os.close(zygote)
        assert exited, "the zygote of the dead pool did not exit"
        assert uid_processes(uid) == [], "the zygote did not kill the sandboxes of its dead pool"
        assert Path(box_dir).exists()
        assert reap_sandboxes(root) == 1 and not Path(box_dir).exists()


def test_a_dead_zygote_is_replaced_and_running_sandboxes_keep_working(runner: LoopThread) -> None:
    with running_pool(runner) as pool:

        async def go() -> None:
            sandbox = await pool.open()
            zygote = await pool.zygote()
            os.kill(zygote.pid, signal.SIGKILL)
            await asyncio.sleep(0.2)
            assert (await sandbox.call(f"{TOOLS}:echo", {"text": "alive"})).value == "alive"
            async with pool.open() as fresh:
                assert (await fresh.call(f"{TOOLS}:echo", {"text": "new"})).value == "new"
            assert pool.zygote_restarts == 1
            timed = await sandbox.call(f"{TOOLS}:sleep", {"s": 30}, timeout_s=0.2)
            assert timed.timed_out
            assert (await sandbox.call(f"{TOOLS}:echo", {"text": "again"})).value == "again"
            await sandbox.close()
            if sandbox.uid is not None:
                assert uid_processes(sandbox.uid) == []

        runner.run(go())


def test_a_pool_that_cannot_import_a_tool_module_says_which(runner: LoopThread) -> None:
    async def go() -> None:
        with sandbox_root() as root:
            pool = SandboxPool(["no_such_module_anywhere"], root=root)
            with pytest.raises(SandboxError, match="no_such_module_anywhere"):
                await pool.start()

    runner.run(go())


def test_shared_uid_mode_still_runs_and_kills_by_process_group(runner: LoopThread) -> None:
    with running_pool(runner, dedicated_uids=False, pid_namespaces=False) as pool:

        async def go() -> None:
            async with pool.open() as sandbox:
                assert sandbox.isolation["uid"] == "shared" and sandbox.isolation["kill"] == "process_group"
                assert sandbox.isolation["mounts"] == ("private_tmp" if IS_ROOT else "shared")
                assert sandbox.uid is None
                assert (await sandbox.call(f"{TOOLS}:echo", {"text": "x"})).ok
                pgid = (await sandbox.call(f"{TOOLS}:whoami", {})).value.split()[3]
                assert (await sandbox.call(f"{TOOLS}:sleep", {"s": 30}, timeout_s=0.2)).timed_out
                with pytest.raises(ProcessLookupError):
                    os.killpg(int(pgid), 0)
                assert (await sandbox.call(f"{TOOLS}:echo", {"text": "y"})).value == "y"

        runner.run(go())


@needs_root
def test_reaping_removes_sandboxes_of_dead_pools_and_kills_their_processes(tmp_path: Path) -> None:
    uid = 2_900_000 + os.getpid() % 50_000
    with sandbox_root() as root:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        orphaned = root / f"sbx-{dead.pid}.1.0000dead"
        (orphaned / "work").mkdir(parents=True)
        os.chown(orphaned / "work", uid, uid)
        live = root / f"sbx-{os.getpid()}.{process_start_ticks(os.getpid())}.0000live"
        (live / "work").mkdir(parents=True)
        legacy = root / "sbx-0000legacy"  # an earlier version's: its owner in owner.json
        (legacy / "work").mkdir(parents=True)
        (legacy / "owner.json").write_text(json.dumps({"pid": dead.pid, "start": 1}))
        unnamed = root / "sbx-0000creating"  # no owner yet: still being made, for a while
        unnamed.mkdir()
        leftover = subprocess.Popen(["sleep", "60"], user=uid, group=uid, extra_groups=[], cwd="/")
        try:
            assert uid_processes(uid) == [leftover.pid]
            assert reap_sandboxes(root, tmp_path) == 2
            assert leftover.wait(timeout=10) == -signal.SIGKILL
            assert not orphaned.exists() and not legacy.exists()
            assert live.exists() and unnamed.exists()
            assert (tmp_path / f"{uid}.lock").read_bytes() == b"clean"
        finally:
            leftover.kill()
            leftover.wait()


@needs_root
def test_unprivileged_processes_still_get_a_network_namespace() -> None:
    code = (
        "import os, socket;"
        "from reprorl.envs.sandbox import confine;"
        "os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534);"
        "assert not confine.unshare_network();"
        "assert confine.unshare_network_unprivileged();"
        "print([name for _, name in socket.if_nameindex()])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['lo']"


def test_without_the_privilege_to_mount_the_scratch_dirs_stay_shared() -> None:
    code = (
        "import os;"
        "from reprorl.envs.sandbox import mounts;"
        "drop = os.geteuid() == 0;"
        "drop and os.setgroups([]); drop and os.setresgid(65534, 65534, 65534);"
        "drop and os.setresuid(65534, 65534, 65534);"
        "before = os.readlink('/proc/self/ns/mnt');"
        "print(mounts.make_private('/', 1 << 20, own_pid_namespace=False));"
        "print(os.readlink('/proc/self/ns/mnt') == before)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["shared", "True"]


@needs_root
def test_the_interpreter_stays_importable_and_nothing_else_beside_it(
    runner: LoopThread, pool: SandboxPool
) -> None:
    """Under its own uid a sandbox can import what the zygote did not (an agent framework imports
    lazily) and start the interpreter again, even when Python lives in a folder others may not enter;
    what else lay in that folder stays out of sight."""
    hidden = mounts.hidden_interpreter_dirs()
    beside = {
        f"{top}/{entry}"
        for top, dirs in hidden
        for entry in (p.name for p in Path(top).iterdir())
        if entry not in {d[len(top) + 1 :].split("/")[0] for d in dirs}
    }
    code = (
        "import importlib, os, subprocess, sys\n"
        "importlib.import_module('colorsys')\n"  # never imported by the zygote
        "again = subprocess.run([sys.executable, '-c', 'import json; print(json.dumps(1))'],"
        " capture_output=True, text=True, timeout=60)\n"
        "seen = sorted(p for p in BESIDE if os.path.lexists(p))\n"
        "result = repr((again.stdout.strip(), again.returncode, seen))\n"
    ).replace("BESIDE", repr(sorted(beside)))
    sandbox = runner.run(pool.open())
    try:
        done = call(runner, sandbox, "run_python", code=code)
    finally:
        runner.run(sandbox.close())
    assert done.ok, done.error
    assert ast.literal_eval(done.value) == ("1", 0, [])
