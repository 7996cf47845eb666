"""Reproduction: a run re-run from its records alone, and every difference from the original named.

The rerun takes the recorded spec (pinned to content hashes) and trains it as a new run in the same
store. Then the two are compared: the code each ran (commit and uncommitted diff: a mismatch is a
warning, not a refusal), every metric line in order with wall-clock figures set aside, and the
hash of the final weights. On the CPU a run reproduces exactly; elsewhere the differences are the
report. Where the spec lets timing decide part of the run (the arrival source, the ready
lockstep), the rerun follows the decisions the record holds (`pipeline.timing`) and the result says
so, with the first place, if any, where the rerun left them; a schedule that cannot be followed is
named, and the rerun then runs on its own timing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from reprorl.config import RunSpec
from reprorl.config.load import stored_spec
from reprorl.errors import UserInputError
from reprorl.orchestrate.jobs.train import train_run
from reprorl.orchestrate.pipeline.timing import RecordedTiming, ScheduleError, read_schedule
from reprorl.store import RunRecord, Store

# Wall-clock figures differ from run to run by nature; they are not part of the result.
VOLATILE_SUFFIXES = ("time", "_s", "seconds")
# `timing/` figures (queue depth, busy share, where episode time went) depend on how fast things ran.
VOLATILE_PARTS = ("/latency_", "timing/")


DAMAGED = "damaged line"


@dataclass(frozen=True)
class Difference:
    line: int  # index in metrics.jsonl (or -1 for the weights)
    key: str
    original: Any
    rerun: Any


@dataclass(frozen=True)
class Reproduction:
    original: str
    rerun: str
    code_warnings: tuple[str, ...]
    adapter: tuple[str | None, str | None]  # final weights' hash: original, rerun
    differences: tuple[Difference, ...] = field(default=())
    lines_compared: int = 0
    timing_dependent: tuple[str, ...] = ()  # what may differ because timing decided it, unfollowed
    followed: str | None = None  # the recorded schedule the rerun followed, when it did
    diverged: str | None = None  # where the rerun first left that schedule

    @property
    def matches(self) -> bool:
        return not self.differences and self.adapter[0] is not None and self.adapter[0] == self.adapter[1]

    def to_json(self) -> dict[str, Any]:
        return {
            "original": self.original,
            "rerun": self.rerun,
            "matches": self.matches,
            "code_warnings": list(self.code_warnings),
            "timing_dependent": list(self.timing_dependent),
            "schedule": {"followed": self.followed, "diverged": self.diverged},
            "adapter": {"original": self.adapter[0], "rerun": self.adapter[1]},
            "lines_compared": self.lines_compared,
            "differences": [
                {"line": d.line, "key": d.key, "original": d.original, "rerun": d.rerun}
                for d in self.differences
            ],
        }


def result_figures(record: RunRecord) -> list[dict[str, Any] | None]:
    """The run's metric lines without their wall-clock figures, in file order; None where a line is
    torn or was edited without its checksum, so the lines after it still line up with the rerun's."""
    log = record.metrics()
    lines: list[dict[str, Any] | None] = [
        {
            k: v
            for k, v in line.items()
            if not any(k == s or k.endswith(s) for s in VOLATILE_SUFFIXES)
            and not any(p in k for p in VOLATILE_PARTS)
        }
        for line in log.records
    ]
    for number in sorted(log.bad_lines):  # 1-based line numbers of the file
        lines.insert(number - 1, None)
    return lines


def final_weights(record: RunRecord) -> str | None:
    saved = [e for e in record.events().records if e.get("event") == "adapter_saved"]
    return str(saved[-1]["adapter"]) if saved else None


def _code(record: RunRecord) -> dict[str, Any]:
    code: dict[str, Any] = record.info().get("environment", {}).get("code", {}).get("cwd") or {}
    return code


def code_warnings(original: RunRecord, rerun: RunRecord) -> tuple[str, ...]:
    a, b = _code(original), _code(rerun)
    warnings = []
    if a.get("commit") != b.get("commit"):
        warnings.append(
            f"code commit differs: {a.get('commit') or 'none'} then, {b.get('commit') or 'none'} now"
        )
    if (a.get("diff") or "") != (b.get("diff") or ""):
        warnings.append("uncommitted changes differ between the original and the rerun")
    if set(a.get("untracked") or ()) != set(b.get("untracked") or ()):
        warnings.append("untracked files differ between the original and the rerun")
    return tuple(warnings)


def timing_dependent(spec: RunSpec) -> tuple[str, ...]:
    """The spec's settings whose results depend on timing, each with what differs because of it."""
    pipeline, notes = spec.learning.pipeline, []
    if pipeline.source == "arrival":
        notes.append(
            "learning.pipeline.source = 'arrival': which version samples each group and which step "
            "trains it depend on timing (each step's batch_assembled event says), so a rerun can differ"
        )
    if pipeline.lockstep == "ready":
        notes.append(
            "learning.pipeline.lockstep = 'ready': which turns share a sampling batch depends on "
            "timing, so a rerun's samples can differ in their last bits (each turn records its batch)"
        )
    return tuple(notes)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def compare_records(original: RunRecord, rerun: RunRecord) -> Reproduction:
    """Every metric and the final weights of `rerun` against `original`."""
    first, second = result_figures(original), result_figures(rerun)
    differences = []
    for line, (a, b) in enumerate(zip(first, second, strict=False)):
        if a is None or b is None:
            damaged = f"metrics.jsonl line {line + 1} is torn or does not match its checksum"
            differences.append(
                Difference(
                    line, DAMAGED, damaged if a is None else "intact", damaged if b is None else "intact"
                )
            )
            continue
        for key in sorted(set(a) | set(b)):
            if not _same(a.get(key), b.get(key)):
                differences.append(Difference(line, key, a.get(key), b.get(key)))
    if len(first) != len(second):
        differences.append(Difference(min(len(first), len(second)), "lines", len(first), len(second)))
    weights = (final_weights(original), final_weights(rerun))
    if weights[0] != weights[1]:
        differences.append(Difference(-1, "final weights", weights[0], weights[1]))
    return Reproduction(
        original.run_id,
        rerun.run_id,
        code_warnings(original, rerun),
        weights,
        tuple(differences),
        min(len(first), len(second)),
    )


async def reproduce_run(store: Store, run_id: str, *, show_progress: bool = False) -> Reproduction:
    """Train the recorded spec of `run_id` again and compare the rerun with it."""
    original = RunRecord(store, run_id)
    if original.status().get("status") != "succeeded":
        raise UserInputError(
            f"run {run_id} did not succeed (status {original.status().get('status')}); "
            "resume it (reprorl run --resume) before reproducing it",
            field="RUN",
        )
    spec = stored_spec(original.spec())
    notes, schedule = timing_dependent(spec), None
    if notes:
        try:
            schedule = read_schedule(original, spec)
        except ScheduleError as exc:
            notes = (*notes, f"the recorded schedule cannot be followed: {exc}")
    timing = RecordedTiming(schedule) if schedule is not None else None
    rerun = await train_run(store, spec, show_progress=show_progress, timing=timing)
    result = compare_records(original, rerun)
    if schedule is None:
        return replace(result, timing_dependent=notes)
    return replace(result, followed=schedule.summary(), diverged=schedule.diverged)
