"""The processes a run starts (verifier workers, the sandbox zygote and its sandboxes) are the run's:
a script without a main guard runs once, and a run killed with SIGKILL leaves none of them behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import run_ids, tiny_training_store

from reprorl.store import RunRecord, Store

SPEC = """
name = "tiny-script"
seed = 5
[model]
owner = "t@x"
base = "tiny"
adapter = { kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }
[data]
owner = "t@x"
train = "calc-train"
reward_weights = { outcome = 1.0, valid_calls = 1.0 }
verifier_timeout_s = 60.0
[learning]
owner = "t@x"
steps = 1
lr = 1e-3
group_size = 2
tasks_per_step = 2
max_tokens = 8
max_turns = 1
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
every_steps = 10
max_unscored_share = 0.0
"""

# No `if __name__ == "__main__":` guard, on purpose; the verifier is a class of this very script.
SCRIPT = """
import dataclasses, pathlib, sys
from reprorl.cli.main import main
from reprorl.rewards.verifiers.numeric import NumericAnswer
from reprorl.rollout.families import FAMILIES

pathlib.Path(sys.argv[1]).open("a").write("imported\\n")


@dataclasses.dataclass(frozen=True)
class ScriptVerifier(NumericAnswer):
    scored: str = ""
    hang_s: float = 0.0

    def score(self, task, state):
        import time

        pathlib.Path(self.scored).open("a").write("x\\n")
        time.sleep(self.hang_s)
        return super().score(task, state)


verifier = ScriptVerifier(scored=sys.argv[1] + ".scored", hang_s=float(sys.argv[4]))
planted = dataclasses.replace(FAMILIES["calculator"], verifier=verifier, cross=())
with FAMILIES.override("calculator", planted):
    main(["--home", sys.argv[2], "run", sys.argv[3]])
"""


def _launch(tmp_path: Path, hang_s: float) -> tuple[subprocess.Popen[bytes], Path, Path]:
    tiny_training_store(tmp_path)
    (tmp_path / "spec.toml").write_text(SPEC)
    (tmp_path / "train.py").write_text(SCRIPT)
    ledger = tmp_path / "ledger.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    home = tmp_path / "home"
    args = [str(ledger), str(home), str(tmp_path / "spec.toml"), str(hang_s)]
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "train.py"), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    return proc, ledger, home


def test_a_script_without_a_main_guard_is_run_once_and_its_own_verifier_scores(tmp_path: Path) -> None:
    proc, ledger, home = _launch(tmp_path, hang_s=0.0)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert ledger.read_text() == "imported\n"  # no worker re-imported the script
    assert b"resource_tracker" not in err and b"leaked" not in err, err.decode()[-2000:]
    (run_id,) = run_ids(home)
    record = RunRecord(Store(home), run_id)
    assert record.status()["status"] == "succeeded"
    (line,) = [m for m in record.metrics().records if m.get("stage") is None]
    assert line["rollouts"] == 4.0 and line["unscored"] == 0.0
    assert len(Path(f"{ledger}.scored").read_text().split()) >= 4  # the script's class did score


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_run_killed_with_sigkill_leaves_no_worker_or_sandbox_process(tmp_path: Path) -> None:
    proc, ledger, _ = _launch(tmp_path, hang_s=300.0)
    scored = Path(f"{ledger}.scored")
    deadline = time.monotonic() + 300
    while not scored.exists():  # a verifier is hanging inside a worker, sandboxes are open
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(0.5)
    children = _descendants(proc.pid)
    commands = {Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") for pid in children}
    assert any(b"reprorl.rewards.worker" in c for c in commands), commands  # the hung verifier's worker
    assert any(b"reprorl.envs.sandbox.worker" in c for c in commands), commands  # the sandbox zygote
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = sorted(pid for pid in children if _alive(pid))
    assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
    print(f"{len(children)} processes of the killed run; {len(left)} left after SIGKILL")


RAY_SPEC = SPEC.replace("steps = 1\n", "steps = 200\npipeline = { workers = 2 }\n")


def test_a_run_on_its_own_ray_cluster_killed_with_sigkill_leaves_no_ray_process(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    tiny_training_store(tmp_path)
    (tmp_path / "spec.toml").write_text(RAY_SPEC.replace("max_unscored_share = 0.0\n", ""))
    home = tmp_path / "home"
    cli = "from reprorl.cli.main import entry; entry()"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            cli,
            "--home",
            str(home),
            "run",
            str(tmp_path / "spec.toml"),
            "--ray",
            "local",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not any(b"rollout_workers" in p.read_bytes() for p in home.glob("runs/2*/events.jsonl")):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.5)
    time.sleep(2)  # the reaper has listed the cluster's processes
    children = _descendants(proc.pid)
    commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children if _alive(pid)]
    assert any(b"ray::" in c or b"raylet" in c for c in commands), commands
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = sorted(pid for pid in children if _alive(pid))
    assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes()[:80] for pid in left]
    print(f"{len(children)} processes of the killed Ray run; {len(left)} left after SIGKILL")
