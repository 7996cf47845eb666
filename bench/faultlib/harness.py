"""Tiny training runs in child processes: started, watched, killed, resumed, and compared with a reference.

Every trial runs the real CLI (`reprorl run`) on the tiny model in a store of its own, copied from
one template store, so a fault in one trial cannot reach another. A reference is the same spec run
once without a fault, in the same mode; a trial's run is compared with it on everything a run
records that does not depend on wall-clock time: each metric line, each sampled token and its
logprob, each reward, and the trained adapter's hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from faultlib import Trial

CLI = "import sys; from reprorl.cli.main import main; sys.exit(main(sys.argv[1:]))"
RUN_TIMEOUT_S = 900.0

# Long enough for a kill to land in the SFT warm start, an RL step, an eval point or a checkpoint.
BASE: dict[str, dict[str, Any]] = {
    "model": {
        "owner": "bench@x",
        "base": "tiny",
        "adapter": {"kind": "lora", "rank": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj"]},
    },
    # The tiny model never answers right; a component that varies gives its groups a signal.
    "data": {
        "owner": "bench@x",
        "train": "calc-train",
        "reward_weights": {"outcome": 1.0, "valid_calls": 1.0},
    },
    "learning": {
        "owner": "bench@x",
        "loss": "ppo_ewma",
        "steps": 4,
        "sft_steps": 2,
        "lr": 1e-3,
        "group_size": 2,
        "tasks_per_step": 2,
        "max_tokens": 12,
        "max_turns": 2,
        "checkpoint_every": 1,
        "drop_zero_variance_groups": False,
    },
    "evaluation": {"owner": "bench@x", "suites": ["calc-eval"], "every_steps": 2},
}

# mode -> (changes to [learning], extra `reprorl run` arguments)
MODES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "sync": ({}, ()),
    # Samples up to two versions ahead: a kill often finds sampled, untrained batches in the queue.
    "async": ({"steps": 6, "pipeline": {"max_staleness": 2}}, ()),
    "ray": ({"pipeline": {"workers": 2}}, ("--ray", "local")),
}


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def spec_text(name: str, seed: int, learning: dict[str, Any]) -> str:
    lines = [f"name = {json.dumps(name)}", f"seed = {seed}"]
    for section, fields in BASE.items():
        lines.append(f"[{section}]")
        merged = {**fields, **learning} if section == "learning" else fields
        lines += [f"{k} = {_toml(v)}" for k, v in merged.items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Outcome:
    """What a finished run recorded that must not depend on faults or wall-clock time."""

    status: str
    adapter: str | None
    metrics: list[dict[str, Any] | None]  # None: a line that fails its checksum
    rollouts: dict[str, Any]  # final rollout id (run prefix dropped) -> reward, tokens, logprobs
    retried: int  # records of attempts an infrastructure failure cut short (kept, not trained on)


@dataclass
class Reference:
    outcome: Outcome
    duration_s: float  # from the run's record appearing to the process ending
    home: Path

    def span(self, first: str, last: str) -> float:
        """Seconds between the reference run's first `first` event and its last `last` one."""
        events = read_events(self.home, run_ids(self.home)[0])
        start = min(stamp(e) for e in events if e.get("event") == first)
        return max(stamp(e) for e in events if e.get("event") == last) - start


def run_ids(home: Path) -> list[str]:
    runs = home / "runs"
    return sorted(p.name for p in runs.iterdir() if not p.name.startswith(".")) if runs.is_dir() else []


def read_events(home: Path, run_id: str) -> list[dict[str, Any]]:
    from reprorl.store import read_log

    return read_log(home / "runs" / run_id / "events.jsonl").records


def stamp(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(record["time"])).timestamp()


def outcome(home: Path, registry: str | None = None) -> Outcome:
    from reprorl.errors import StoreError
    from reprorl.orchestrate.jobs.reproduce import result_figures
    from reprorl.store import RunRecord, Store
    from reprorl.store.rollout_query import RolloutStore

    store = Store(home, db_url=registry)
    (run_id,) = run_ids(home)
    record = RunRecord(store, run_id)
    status = str(record.status()["status"])
    rollouts: dict[str, Any] = {}
    retried = 0
    try:
        trajectories = list(RolloutStore(record).trajectories())
    except StoreError:  # a damaged part the run kept: its rollouts cannot be read back
        status, trajectories = "records unreadable", []
    for t in trajectories:
        if t.retried:
            retried += 1
            continue
        # An episode run again after an infrastructure failure ends under its id plus "~<try>".
        rollouts[t.rollout_id.split("/", 1)[1].split("~", 1)[0]] = (
            t.reward.total if t.reward else None,
            [(x.token_ids, x.logprobs) for x in t.turns],
            t.termination.value,
        )
    saved = [e["adapter"] for e in record.events().records if e.get("event") == "adapter_saved"]
    store.close()
    return Outcome(status, saved[-1] if saved else None, result_figures(record), rollouts, retried)


def _key(line: dict[str, Any]) -> tuple[Any, ...]:
    return (line.get("step"), line.get("stage"), line.get("suite"))


def _keys(lines: list[dict[str, Any] | None]) -> set[tuple[Any, ...]]:
    return {_key(m) for m in lines if m is not None}


def _tokens(rollout: Any) -> tuple[Any, ...]:
    reward, turns, end = rollout
    return reward, [t for t, _ in turns], end


def compare(reference: Outcome, got: Outcome) -> tuple[bool, int, bool]:
    """(bit-identical to the reference, reference records missing from `got`, every rollout with
    the reference's sampled tokens, reward and end)."""
    lost = len(reference.rollouts.keys() - got.rollouts.keys())
    lost += len(_keys(reference.metrics) - _keys(got.metrics))
    same = (
        got.status == "succeeded"
        and got.adapter == reference.adapter
        and got.metrics == reference.metrics
        and got.rollouts == reference.rollouts
    )
    tokens = reference.rollouts.keys() == got.rollouts.keys() and all(
        _tokens(reference.rollouts[k]) == _tokens(got.rollouts[k]) for k in reference.rollouts
    )
    return same, lost, tokens


def differences(reference: Outcome, got: Outcome) -> list[str]:
    """Where `got` departs from the reference, a few words each (for a trial's notes)."""
    found: list[str] = []
    if got.adapter != reference.adapter:
        found.append("adapter differs")
    mine = {_key(m): m for m in got.metrics if m is not None}
    for line in reference.metrics:
        if line is None:
            continue
        other = mine.get(_key(line))
        if other is not None and other != line:
            keys = sorted(k for k in line.keys() | other.keys() if line.get(k) != other.get(k))
            found.append(f"metrics {_key(line)[:2]} differ in {', '.join(keys[:4])}")
            break
    changed = [
        k for k in reference.rollouts.keys() & got.rollouts.keys() if reference.rollouts[k] != got.rollouts[k]
    ]
    # Same tokens, rewards and ends with other logprobs: the same samples scored in another batch.
    only_logprobs = [k for k in changed if _tokens(reference.rollouts[k]) == _tokens(got.rollouts[k])]
    if only_logprobs:
        gap = max(
            abs(a - b)
            for k in only_logprobs
            for (_, la), (_, lb) in zip(reference.rollouts[k][1], got.rollouts[k][1], strict=True)
            for a, b in zip(la, lb, strict=True)
        )
        found.append(f"{len(only_logprobs)} rollouts differ only in logprobs (at most {gap:.1e})")
    if len(changed) > len(only_logprobs):
        found.append(f"{len(changed) - len(only_logprobs)} rollouts differ in tokens, rewards or ends")
    return found


@dataclass
class Bench:
    """Scratch space, a template store, and references cached per (mode, learning changes)."""

    root: Path
    seed: int = 20261204
    keep: bool = False  # keep each trial's store (for a look afterwards)
    _references: dict[str, Reference] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs = self.root / "logs"
        self.logs.mkdir(exist_ok=True)
        self.template = self.root / "template"
        if not (self.template / "registry.db").exists():
            from reprorl.policy import save_model, tiny_model

            model = tiny_model(0)
            save_model(model.model, model.tokenizer, self.root / "tiny")
            self._populate(self.template, None)

    def _populate(self, home: Path, registry: str | None) -> None:
        """The tiny model and the calculator task sets, added to the store at `home`."""
        from reprorl.store import Store

        store = Store(home, db_url=registry)
        store.add("tiny", self.root / "tiny", kind="model")
        for name in ("calc-train", "calc-eval"):
            with resources.as_file(resources.files("reprorl") / "examples" / f"{name}.jsonl") as path:
                store.add(name, path, kind="taskset")
        store.close()

    def home(self, name: str, at: Path | None = None, registry: str | None = None) -> Path:
        """A fresh store named `name` (under `at` when given): a copy of the template, or with
        `registry` (a database URL) the same artifacts added to a store using that registry."""
        home = (at or self.root) / name
        shutil.rmtree(home, ignore_errors=True)
        if registry is None:
            shutil.copytree(self.template, home)
        else:
            self._populate(home, registry)
        return home

    def discard(self, home: Path, trial: Trial | None = None) -> None:
        """Remove a trial's store, unless it is kept: all of them with `keep`, and those of
        trials that did not end identical to the reference, for a look afterwards."""
        if not self.keep and (trial is None or trial.identical):
            shutil.rmtree(home, ignore_errors=True)

    def spec(self, mode: str, **learning: Any) -> tuple[Path, tuple[str, ...]]:
        """The spec file of `mode` with `learning` changes, and the run arguments of the mode."""
        changes, args = MODES[mode]
        merged = {**changes, **learning}
        key = json.dumps([mode, merged], sort_keys=True)
        path = self.root / f"spec-{hashlib.sha256(key.encode()).hexdigest()[:8]}.toml"
        path.write_text(spec_text(f"faults-{mode}", 11, merged))
        return path, args

    def reference(self, mode: str, **learning: Any) -> Reference:
        spec, args = self.spec(mode, **learning)
        if spec.name not in self._references:
            home = self.home(f"reference-{spec.stem}")
            proc = self.start(home, "run", str(spec), *args)
            began = self.await_record(home, proc)
            self.finish(proc)
            self._references[spec.name] = Reference(outcome(home), time.perf_counter() - began, home)
            if self._references[spec.name].outcome.status != "succeeded":
                raise RuntimeError(f"the reference run of {mode} did not succeed")
        return self._references[spec.name]

    # -- child processes -----------------------------------------------------------------------

    def start(self, home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = self.logs / f"{home.name}-{time.time_ns()}.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", CLI, "--home", str(home), *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # the run, its workers, sandboxes and Ray go with one kill
            )
        proc.log = log  # type: ignore[attr-defined]
        return proc

    @staticmethod
    def log_of(proc: subprocess.Popen[bytes]) -> str:
        return Path(proc.log).read_text(errors="replace")  # type: ignore[attr-defined]

    def finish(self, proc: subprocess.Popen[bytes], timeout: float = RUN_TIMEOUT_S) -> int:
        """The run's exit code; a run still going after `timeout` is hung: killed, and -9."""
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.stacks = stacks_of(proc.pid)  # type: ignore[attr-defined]
            self.kill(proc)
            proc.hung = True  # type: ignore[attr-defined]
            return -9

    @staticmethod
    def stacks(proc: subprocess.Popen[bytes]) -> str:
        """The stacks of a run `finish` found hung."""
        return str(getattr(proc, "stacks", ""))

    @staticmethod
    def hung(proc: subprocess.Popen[bytes]) -> bool:
        """Whether `finish` gave up on the run."""
        return bool(getattr(proc, "hung", False))

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    @staticmethod
    def await_record(home: Path, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> float:
        """When the run's record appeared (or the process ended first)."""
        return wait_until(lambda: bool(run_ids(home)), proc, timeout)

    def conclude(
        self,
        home: Path,
        reference: Outcome,
        notes: list[str],
        recover_s: float | None,
        *,
        registry: str | None = None,
    ) -> Trial:
        """The trial of the run under `home` against `reference`, with how it departs from it in
        its notes; its store is cleared unless the run is not identical (kept for a look)."""
        got = outcome(home, registry)
        if got.retried:
            notes.append("episodes cut short were recorded and run again")
        same, lost, tokens = compare(reference, got)
        notes += differences(reference, got)
        trial = Trial(got.status == "succeeded", same, lost, recover_s, tuple(notes), same_tokens=tokens)
        self.discard(home, trial)
        return trial

    def kill_unfinished(self, home: Path, proc: subprocess.Popen[bytes]) -> bool:
        """SIGKILL the run under `home` unless it has finished; False (its store cleared) when it had,
        or when the kill came as the finished process was exiting: not a trial."""
        if proc.poll() is None:
            self.kill(proc)
            if not self.succeeded(home):
                return True
        self.discard(home)
        return False

    @staticmethod
    def succeeded(home: Path) -> bool:
        """Whether the run under `home` is recorded as finished (a kill can land after that)."""
        runs = run_ids(home)
        if not runs:
            return False
        status = json.loads((home / "runs" / runs[0] / "status.json").read_text())
        return bool(status.get("status") == "succeeded")

    def await_event(
        self, home: Path, proc: subprocess.Popen[bytes], kind: str, *, timeout: float = 300.0, **fields: Any
    ) -> float:
        """When the run under `home` wrote an event of `kind` (with these `fields`), or `proc` ended."""

        def seen() -> bool:
            return any(
                e.get("event") == kind and all(e.get(k) == v for k, v in fields.items())
                for e in self.events(home)
            )

        return wait_until(seen, proc, timeout)

    def events(self, home: Path) -> list[dict[str, Any]]:
        runs = run_ids(home)
        return read_events(home, runs[0]) if runs else []


def stacks_of(pid: int) -> str:
    """Where a hung process waits: its threads' Python stacks (py-spy), or why they are unknown."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no stacks: {exc})"
    return done.stdout or done.stderr


def wait_until(cond: Callable[[], bool], proc: subprocess.Popen[bytes] | None, timeout: float) -> float:
    """Poll `cond` until it holds, `proc` ends or `timeout` passes; returns the time it stopped."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        try:
            if cond():
                break
        except (OSError, ValueError):
            pass  # a file being written: read it again
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.02)
    return time.perf_counter()


PROGRESS = frozenset({"resumed", "rollouts_written", "checkpoint", "adapter_saved"})


def progress_after(
    events: list[dict[str, Any]], after: float, kinds: frozenset[str] = PROGRESS
) -> float | None:
    """Seconds from `after` (epoch) to the first event of `kinds` written after it."""
    times = [stamp(e) for e in events if e.get("event") in kinds and stamp(e) > after]
    return min(times) - after if times else None
