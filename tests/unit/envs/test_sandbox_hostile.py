"""Hostile code inside a sandbox: every probe is blocked or bounded, classified, and the host is unharmed.

Each probe runs arbitrary Python in the sandbox process through `sandbox_tools.run_python`. The
strong guarantees (no network, a process limit, unreadable root files, nothing surviving a freeze,
private scratch directories and /proc) need root; without it these tests skip and say so.
"""

from __future__ import annotations

import ast
import asyncio
import os
import secrets
import shutil
import signal
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_support import TOOLS, LoopThread, needs_root, running_pool, sandbox_root, uid_processes

from reprorl.envs.sandbox import CallResult, Sandbox, SandboxLimits, SandboxPool

pytestmark = needs_root

MIB = 1 << 20
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


@pytest.fixture(scope="module")
def runner() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


@pytest.fixture(scope="module")
def pool(runner: LoopThread) -> Iterator[SandboxPool]:
    with running_pool(runner) as p:
        yield p


@pytest.fixture
def sandbox(runner: LoopThread, pool: SandboxPool) -> Iterator[Sandbox]:
    box: Sandbox = runner.run(pool.open())
    assert box.isolation["uid"] == "dedicated" and box.isolation["network"] == "netns"
    assert box.isolation["mounts"] == "private_tmp_proc"
    yield box
    runner.run(box.close())
    assert box.uid is not None and uid_processes(box.uid) == []


def run_code(runner: LoopThread, box: Sandbox, code: str, timeout_s: float | None = None) -> CallResult:
    result: CallResult = runner.run(box.call(f"{TOOLS}:run_python", {"code": code}, timeout_s=timeout_s))
    return result


def test_no_network_reaches_the_host_or_the_outside(runner: LoopThread, sandbox: Sandbox) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        for host in ("127.0.0.1", "1.1.1.1", "8.8.8.8"):
            target = (host, port if host == "127.0.0.1" else 53)
            probe = run_code(runner, sandbox, f"import socket; socket.create_connection({target!r}, 2)")
            assert not probe.ok and probe.error_type == "OSError", probe
            assert "unreachable" in (probe.error or "").lower()
        with pytest.raises(BlockingIOError):
            listener.accept()
    interfaces = run_code(runner, sandbox, "import socket; result = socket.if_nameindex()")
    assert interfaces.value == "[(1, 'lo')]"
    lo_up = "import subprocess; subprocess.run(['ip', 'link', 'set', 'lo', 'up'], check=True)"
    assert not run_code(runner, sandbox, lo_up).ok


def test_a_fork_bomb_is_bounded_and_leaves_nothing_behind(runner: LoopThread, pool: SandboxPool) -> None:
    limits = SandboxLimits(processes=16)
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"

    async def go() -> tuple[CallResult, int, int]:
        async with pool.open(limits=limits) as box:
            assert box.uid is not None
            call = asyncio.create_task(box.call(f"{TOOLS}:run_python", {"code": bomb}, timeout_s=1.5))
            peak = 0
            while not call.done():
                peak = max(peak, len(uid_processes(box.uid)))
                await asyncio.sleep(0.05)
            other = await pool.open()
            try:
                assert (await other.call(f"{TOOLS}:echo", {"text": "unaffected"})).value == "unaffected"
            finally:
                await other.close()
            return call.result(), peak, box.uid

    result, peak, uid = runner.run(go())
    assert result.timed_out and not result.ok
    assert 1 < peak <= limits.processes
    assert uid_processes(uid) == []


def test_a_huge_allocation_fails_inside_the_sandbox(runner: LoopThread, sandbox: Sandbox) -> None:
    result = run_code(runner, sandbox, "x = bytearray(8 << 30)")
    assert result.error_type == "MemoryError" and not result.crashed
    assert run_code(runner, sandbox, "result = 'fine'").value == "fine"


def test_creeping_allocation_stops_at_the_memory_limit(runner: LoopThread, pool: SandboxPool) -> None:
    creep = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))"

    async def go() -> tuple[CallResult, CallResult]:
        async with pool.open(limits=SandboxLimits(memory_bytes=128 * MIB)) as box:
            return (
                await box.call(f"{TOOLS}:run_python", {"code": creep}),
                await box.call(f"{TOOLS}:echo", {"text": "fine"}),
            )

    creeping, after = runner.run(go())
    assert creeping.error_type == "MemoryError" or creeping.crashed
    assert after.value == "fine"


def test_an_infinite_loop_times_out(runner: LoopThread, sandbox: Sandbox) -> None:
    started = time.perf_counter()
    result = run_code(runner, sandbox, "while True:\n    pass", timeout_s=0.5)
    assert result.timed_out and time.perf_counter() - started < 3
    assert run_code(runner, sandbox, "result = 'next'").value == "next"


def test_the_cpu_limit_kills_a_spinning_sandbox(runner: LoopThread, pool: SandboxPool) -> None:
    async def go() -> tuple[CallResult, CallResult]:
        async with pool.open(limits=SandboxLimits(cpu_s=1)) as box:
            spin = await box.call(f"{TOOLS}:run_python", {"code": "while True:\n    pass"}, timeout_s=20)
            return spin, await box.call(f"{TOOLS}:echo", {"text": "respawned"})

    spin, after = runner.run(go())
    assert spin.crashed and not spin.timed_out and spin.duration_s < 10
    assert spin.signal is not None and "CPU limit" in (spin.error or "")
    assert spin.cpu_s is not None and spin.cpu_s >= 0.9
    assert f"after {spin.cpu_s:.2f} CPU-s" in (spin.error or "")
    assert after.value == "respawned"


def test_a_sandbox_killed_early_is_not_blamed_on_its_cpu_limit(runner: LoopThread, pool: SandboxPool) -> None:
    code = "import ctypes\nctypes.string_at(0)"  # a fault: the kernel's SIGSEGV reaches even a namespace init

    async def go() -> CallResult:
        async with pool.open(limits=SandboxLimits(cpu_s=5)) as box:
            return await box.call(f"{TOOLS}:run_python", {"code": code})

    died = runner.run(go())
    assert died.crashed and died.signal == signal.SIGSEGV and died.cpu_s is not None and died.cpu_s < 1
    assert "CPU limit" not in (died.error or "") and "CPU-s" in (died.error or "")


def test_a_huge_file_stops_at_the_file_size_limit(runner: LoopThread, pool: SandboxPool) -> None:
    limit = 8 * MIB
    code = "with open('big.bin', 'wb') as f:\n    for _ in range(1024):\n        f.write(b'0' * (1 << 20))"

    async def go() -> tuple[CallResult, int]:
        async with pool.open(limits=SandboxLimits(file_bytes=limit)) as box:
            result = await box.call(f"{TOOLS}:run_python", {"code": code})
            return result, (box.workdir / "big.bin").stat().st_size

    result, size = runner.run(go())
    assert result.error_type == "OSError" and "File too large" in (result.error or "")
    assert size <= limit


def test_files_outside_the_sandbox_cannot_be_read(
    runner: LoopThread, pool: SandboxPool, sandbox: Sandbox
) -> None:
    secret = sandbox.dir / "secret.txt"  # root's, beside work/: in the sandbox's view, but not readable
    secret.write_text("root only")
    secret.chmod(0o600)
    for path in (str(secret), "/root/.bashrc", "/etc/shadow", "../../"):
        probe = runner.run(sandbox.call(f"{TOOLS}:read", {"path": path}))
        # Root's home is not even there when the interpreter lives in it (only the interpreter is).
        hidden = path.startswith("/root/") and probe.error_type == "FileNotFoundError"
        assert probe.error_type in {"PermissionError", "IsADirectoryError"} or hidden, (path, probe)
    listing = runner.run(sandbox.call(f"{TOOLS}:listdir", {"path": ".."}))
    assert listing.error_type == "PermissionError"
    with sandbox_root() as outside:
        (outside / "host.txt").write_text("the host's /tmp")
        (outside / "host.txt").chmod(0o644)
        probe = runner.run(sandbox.call(f"{TOOLS}:read", {"path": str(outside / "host.txt")}))
        assert probe.error_type == "FileNotFoundError", probe  # the sandbox's /tmp is its own

    async def neighbour() -> CallResult:
        async with pool.open() as other:
            await other.call(f"{TOOLS}:write", {"path": "private.txt", "text": "theirs"})
            return await sandbox.call(f"{TOOLS}:read", {"path": str(other.workdir / "private.txt")})

    # The pool root lies in /tmp, so only the sandbox's own directory is in its view.
    assert runner.run(neighbour()).error_type == "FileNotFoundError"


def test_a_neighbour_is_unreadable_where_the_pool_root_is_in_view(runner: LoopThread) -> None:
    run = Path("/run")
    if not (run.is_dir() and os.access(run, os.W_OK) and run.stat().st_mode & stat.S_IXOTH):
        pytest.skip("needs a pool root outside /tmp, /var/tmp and /dev/shm: /run is not usable here")
    root = Path(tempfile.mkdtemp(prefix="reprorl-sbx-test-", dir=run))
    try:
        with running_pool(runner, root=root) as visible:

            async def go() -> tuple[CallResult, CallResult]:
                async with visible.open() as first, visible.open() as second:
                    await first.call(f"{TOOLS}:write", {"path": "private.txt", "text": "theirs"})
                    stolen = await second.call(f"{TOOLS}:read", {"path": str(first.workdir / "private.txt")})
                    return stolen, await second.call(f"{TOOLS}:listdir", {"path": str(root)})

            stolen, listing = runner.run(go())
        assert stolen.error_type == "PermissionError" and listing.error_type == "PermissionError"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_nothing_outside_the_sandbox_can_be_written(
    runner: LoopThread, pool: SandboxPool, sandbox: Sandbox
) -> None:
    host_file = sandbox.dir / "host.txt"
    host_file.write_text("original")
    host_file.chmod(0o644)
    for path in (str(host_file), "../evil.txt", "../../evil.txt", str(pool.root / "evil.txt")):
        probe = runner.run(sandbox.call(f"{TOOLS}:write", {"path": path, "text": "pwned"}))
        assert probe.error_type == "PermissionError", (path, probe)
    assert host_file.read_text() == "original"
    assert not (pool.root / "evil.txt").exists() and not (sandbox.dir / "evil.txt").exists()
    chmod = run_code(runner, sandbox, f"import os; os.chmod({str(host_file)!r}, 0o666)")
    assert chmod.error_type == "PermissionError"


def test_the_zygote_and_the_pool_are_out_of_reach(
    runner: LoopThread, pool: SandboxPool, sandbox: Sandbox
) -> None:
    zygote = runner.run(pool.zygote())
    for target in (zygote.pid, os.getpid()):
        probe = run_code(runner, sandbox, f"import os, signal; os.kill({target}, signal.SIGKILL)")
        assert probe.error_type in {"ProcessLookupError", "PermissionError"}, probe
    escalate = run_code(runner, sandbox, "import os; os.setuid(0)")
    assert escalate.error_type == "PermissionError"
    assert zygote.alive and (runner.run(pool.zygote())).pid == zygote.pid


def test_a_double_forked_orphan_dies_at_freeze(runner: LoopThread, sandbox: Sandbox) -> None:
    orphan = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        while True:\n"
        "            with open('grow.txt', 'a') as f:\n"
        "                f.write('x')\n"
        "            time.sleep(0.01)\n"
        "    os._exit(0)\n"
        "result = 'spawned'"
    )
    assert run_code(runner, sandbox, orphan).value == "spawned"
    grow = Path(sandbox.workdir, "grow.txt")
    deadline = time.monotonic() + 5
    while (not grow.exists() or grow.stat().st_size < 5) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert grow.stat().st_size >= 5, "the orphan never ran"
    runner.run(sandbox.freeze())
    size = grow.stat().st_size
    time.sleep(0.3)
    assert grow.stat().st_size == size
    assert sandbox.uid is not None and uid_processes(sandbox.uid) == []


def plant(name: str) -> str:
    """Code that leaves a file `name` in every scratch directory and checks it is there."""
    return (
        "from pathlib import Path\n"
        f"for d in {SCRATCH_DIRS!r}:\n"
        f"    Path(d, {name!r}).write_text('left behind')\n"
        f"    assert Path(d, {name!r}).read_text() == 'left behind'\n"
        "result = 'planted'"
    )


def look(name: str) -> str:
    """Code that reports which scratch directories hold a file `name`."""
    return f"import os\nresult = [d for d in {SCRATCH_DIRS!r} if os.path.lexists(os.path.join(d, {name!r}))]"


def on_host(name: str) -> list[str]:
    return [d for d in SCRATCH_DIRS if Path(d, name).exists() or Path(d, name).is_symlink()]


def test_scratch_files_reach_neither_the_host_nor_an_open_neighbour(
    runner: LoopThread, pool: SandboxPool, sandbox: Sandbox
) -> None:
    name = f"reprorl-leak-{secrets.token_hex(6)}"
    assert run_code(runner, sandbox, plant(name)).value == "planted"
    assert run_code(runner, sandbox, look(name)).value == str(list(SCRATCH_DIRS))
    assert on_host(name) == []

    async def neighbour() -> CallResult:
        async with pool.open() as other:
            return await other.call(f"{TOOLS}:run_python", {"code": look(name)})

    assert runner.run(neighbour()).value == "[]"
    runner.run(sandbox.close())
    assert on_host(name) == []


def test_a_later_sandbox_on_the_same_uid_finds_no_scratch_files(runner: LoopThread) -> None:
    name = f"reprorl-leak-{secrets.token_hex(6)}"
    # One uid slot, from a range no other test's pool uses, so the second sandbox gets the first's uid.
    uid_base = 2_800_000 + os.getpid() % 50_000
    with running_pool(runner, uid_base=uid_base, max_sandboxes=1) as solo:

        async def go() -> tuple[int | None, int | None, CallResult]:
            first = await solo.open()
            assert (await first.call(f"{TOOLS}:run_python", {"code": plant(name)})).value == "planted"
            await first.close()
            async with solo.open() as later:
                return first.uid, later.uid, await later.call(f"{TOOLS}:run_python", {"code": look(name)})

        first_uid, later_uid, found = runner.run(go())
    assert first_uid is not None and first_uid == later_uid
    assert found.value == "[]"
    assert on_host(name) == []


def test_scratch_files_vanish_when_the_sandbox_process_restarts(runner: LoopThread, sandbox: Sandbox) -> None:
    name = f"reprorl-leak-{secrets.token_hex(6)}"
    assert run_code(runner, sandbox, plant(name)).value == "planted"
    assert run_code(runner, sandbox, "import os; os._exit(1)").crashed
    assert run_code(runner, sandbox, look(name)).value == "[]"


def test_scratch_space_is_bounded_together(runner: LoopThread, pool: SandboxPool) -> None:
    fill = (
        "import errno\n"
        "written = 0\n"
        "try:\n"
        f"    for i, d in enumerate({SCRATCH_DIRS!r} * 4):\n"
        "        with open(f'{d}/fill{i}', 'wb') as f:\n"
        "            for _ in range(4):\n"
        "                f.write(b'x' * (1 << 20))\n"
        "                written += 1 << 20\n"
        "except OSError as exc:\n"
        "    assert exc.errno == errno.ENOSPC, exc\n"
        "result = written"
    )

    async def go() -> CallResult:
        async with pool.open(limits=SandboxLimits(tmp_bytes=16 * MIB)) as box:
            return await box.call(f"{TOOLS}:run_python", {"code": fill})

    written = runner.run(go())
    assert written.ok, written
    assert 12 * MIB <= int(written.value) <= 16 * MIB


def test_proc_shows_only_the_sandboxs_own_processes(
    runner: LoopThread, pool: SandboxPool, sandbox: Sandbox
) -> None:
    listing = (
        "import os, subprocess\n"
        "child = subprocess.Popen(['sleep', '30'])\n"
        "try:\n"
        "    result = (sorted(int(e) for e in os.listdir('/proc') if e.isdigit()), child.pid)\n"
        "finally:\n"
        "    child.kill()\n"
        "    child.wait()"
    )
    pids, child = ast.literal_eval(run_code(runner, sandbox, listing).value)
    assert pids == [1, child]
    zygote = runner.run(pool.zygote())
    assert os.getpid() not in pids and zygote.pid not in pids
    for host_pid in (os.getpid(), zygote.pid):
        probe = runner.run(sandbox.call(f"{TOOLS}:read", {"path": f"/proc/{host_pid}/cmdline"}))
        assert probe.error_type == "FileNotFoundError", probe
    assert run_code(runner, sandbox, "import os; result = os.readlink('/proc/self')").value == "1"


def test_a_pool_root_behind_a_link_under_a_scratch_dir_still_works(runner: LoopThread) -> None:
    real = Path(tempfile.mkdtemp(prefix="reprorl-sbx-test-", dir="/var/tmp"))
    link = Path(tempfile.gettempdir(), f"reprorl-sbx-link-{secrets.token_hex(6)}")
    try:
        real.chmod(0o711)
        link.symlink_to(real)
        with running_pool(runner, root=link) as linked:

            async def go() -> tuple[CallResult, dict[str, str], Path]:
                async with linked.open() as box:
                    await box.call(f"{TOOLS}:write", {"path": "a.txt", "text": "here"})
                    return await box.call(f"{TOOLS}:read", {"path": "a.txt"}), box.isolation, box.workdir

            read, isolation, workdir = runner.run(go())
        assert read.value == "here" and isolation["mounts"] == "private_tmp_proc"
        assert workdir.parent.parent == link and not workdir.exists()
    finally:
        link.unlink(missing_ok=True)
        shutil.rmtree(real, ignore_errors=True)
