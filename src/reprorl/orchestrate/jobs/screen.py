"""Screening a task set: which tasks a policy can learn from, and which rewards can be trusted.

`screen` runs the policy k times on every task (seeded per attempt, through the rollout runner, in
parallel), replays one answered attempt per task action for action and re-scores it (a verifier
that changes its mind is `flaky`), and runs every exploit probe on each task (one that scores
makes the task `suspect`). Tasks go in chunks; each chunk's episodes — attempts, replays and
probes — are stored as one rollout part and its verdicts as one checksummed line, so a killed
screen resumes at the first chunk without a line. At the end the trainable subset is registered
as a new version of the task set, its lineage pointing at the screened version, the policy, and
the screen's record (which holds the settings).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from reprorl.config.screen import ScreenSpec
from reprorl.errors import UserInputError
from reprorl.evaluation.screening import ScreenReport, TaskScreen
from reprorl.orchestrate.run.damage import drop_damaged_steps
from reprorl.orchestrate.run.policies import open_policy
from reprorl.orchestrate.run.rollouts import load_taskset, progress_bar
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sampler
from reprorl.rewards.audit import PROBES
from reprorl.rewards.audit.probes import MAX_TURNS as PROBE_TURNS
from reprorl.rollout.episode import EpisodeLimits, Policy, Provenance, ScriptedPolicy
from reprorl.rollout.families import Family, families_named
from reprorl.rollout.runner import PolicyFactory, RolloutJob, RolloutRunner, plan_groups
from reprorl.store import RunRecord, Store
from reprorl.store.compaction import check_resumable
from reprorl.store.rollouts import DISCARDED_EVENT, RolloutWriter, find_parts
from reprorl.types import Message, Role, SamplingParams, Task, TaskSet, Termination, Trajectory

STAGE = "screen"
ORACLE = "oracle"


@dataclass(frozen=True)
class ScriptedScreenPolicy:
    """A scripted policy to screen with (the oracle, or a library user's own), instead of a model."""

    name: str
    make: PolicyFactory


def is_script(policy: str) -> bool:
    """Whether a screen's policy is a script (the oracle, or `script:<name>` from the library)."""
    return policy == ORACLE or policy.startswith("script:")


def parse_policy(store: Store, text: str) -> str:
    """`MODEL[+ADAPTER]` with both pinned to hashes, or `oracle`."""
    if text == ORACLE:
        return ORACLE
    base, _, adapter = text.partition("+")
    if not base:
        raise UserInputError(f"--policy {text!r}: write MODEL or MODEL+ADAPTER (or oracle)", field="--policy")
    pinned = store.pin_newest(base)
    return f"{pinned}+{store.pin_newest(adapter)}" if adapter else pinned


def _credit(trajectory: Trajectory) -> float | None:
    reward = trajectory.reward
    # Outcome credit, or the weighted total where shaping makes it more: either is reward.
    return None if reward is None else max(reward.components.get("outcome", reward.total), reward.total)


def _replayer(texts: Sequence[str]) -> Callable[[Task, Sequence[Message]], str]:
    """A script that says again, turn by turn, what a recorded attempt said."""

    def script(task: Task, messages: Sequence[Message]) -> str:
        turn = sum(1 for m in messages if m.role == Role.ASSISTANT)
        return texts[turn] if turn < len(texts) else ""

    return script


class Screener:
    """One screen: its record, runner and settings; `run` screens every chunk not yet on record."""

    def __init__(
        self,
        store: Store,
        spec: ScreenSpec,
        record: RunRecord,
        tasks: Sequence[Task],
        families: Mapping[str, Family],
        scripted: ScriptedScreenPolicy | None,
    ) -> None:
        self.store, self.spec, self.record, self.tasks = store, spec, record, tasks
        self.families, self.scripted = families, scripted
        self.writer = RolloutWriter(record)
        self.chunks = [tasks[i : i + spec.chunk] for i in range(0, len(tasks), spec.chunk)]

    def done(self) -> dict[int, list[TaskScreen]]:
        """The chunks on record, with their verdicts."""
        found: dict[int, list[TaskScreen]] = {}
        for line in self.record.metrics().records:
            if line.get("stage") == STAGE:
                found[int(line["step"])] = [TaskScreen.from_json(t) for t in line["screened"]]
        return found

    def sweep(self, done: Mapping[int, object]) -> None:
        """Remove parts of chunks that have no verdict line (a kill came between the two)."""
        stale = [p for p, step, _ in find_parts(self.record.path) if step not in done]
        if stale:
            names = [p.relative_to(self.record.path).as_posix() for p in stale]
            self.record.event(DISCARDED_EVENT, parts=names, reason="resume")
            for path in stale:
                path.unlink(missing_ok=True)

    @contextlib.asynccontextmanager
    async def runner(self) -> AsyncIterator[RolloutRunner]:
        """The rollout runner of this screen's policy: the model's sampler, or the script."""
        if self.scripted is not None or is_script(self.spec.policy):
            if self.scripted is None and self.spec.policy != ORACLE:
                raise UserInputError(
                    f"{self.spec.policy} is a library script: resume this screen from Python with "
                    "screen(..., scripted=...)",
                    field="policy",
                )
            scripted = self.scripted or ScriptedScreenPolicy(ORACLE, self._oracle)
            provenance = Provenance(base_model_hash=f"script:{scripted.name}")
            async with self._runner(None, None, provenance) as runner:
                yield runner.with_policy(scripted.make, provenance)
            return
        base, _, adapter = self.spec.policy.partition("+")
        opened = open_policy(self.store, base, adapter=adapter or None, dtype=self.spec.sampling_dtype)
        async with self._runner(opened.sampler, opened.renderer, opened.provenance) as runner:
            yield runner

    def _runner(
        self, sampler: Sampler | None, renderer: ChatRenderer | None, provenance: Provenance
    ) -> RolloutRunner:
        spec = self.spec
        return RolloutRunner(
            sampler,
            renderer,
            run_id=self.record.run_id,
            params=SamplingParams(temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_tokens),
            provenance=provenance,
            limits=EpisodeLimits(max_turns=spec.max_turns, max_tokens=spec.max_turns * spec.max_tokens),
            families=self.families,
            concurrency=spec.concurrency,
            max_batch=spec.concurrency,
        )

    def _oracle(self, job: RolloutJob, rollout_id: str) -> Policy:
        return ScriptedPolicy(job.task, self.families[job.task.family].oracle, name=ORACLE)

    async def sample_chunk(self, runner: RolloutRunner, index: int) -> list[TaskScreen]:
        """Attempts, replays and probes of chunk `index`, stored as one part; its verdicts."""
        spec, run_id = self.spec, self.record.run_id
        chunk = self.chunks[index]
        jobs = plan_groups(chunk, spec.k, run_id=run_id, run_seed=spec.seed, step=index, kind="screen")
        attempts = await runner.run(jobs)
        by_task: dict[str, list[tuple[RolloutJob, Trajectory]]] = defaultdict(list)
        for job, trajectory in zip(jobs, attempts.trajectories, strict=True):
            by_task[job.task.id].append((job, trajectory))
        # Replays: one answered attempt per task, said again in a fresh sandbox with the same env seed.
        replay_jobs: list[RolloutJob] = []
        scripts: dict[str, list[str]] = {}
        originals: dict[str, Trajectory] = {}
        for task in chunk:
            answered = [
                (j, t) for j, t in by_task[task.id] if t.termination is Termination.ANSWERED and t.reward
            ]
            if not answered:
                continue
            job, original = answered[0]
            originals[task.id] = original
            for r in range(spec.replays):
                rollout_id = f"{job.rollout_id}~replay{r}"
                replay_jobs.append(RolloutJob(task, rollout_id, job.group_id, job.member, job.step, job.seed))
                scripts[rollout_id] = [turn.text for turn in original.turns]

        def replay(job: RolloutJob, rollout_id: str) -> Policy:
            return ScriptedPolicy(job.task, _replayer(scripts[rollout_id]), name="replay")

        replays = (
            await runner.with_policy(replay, runner.provenance).run(replay_jobs) if replay_jobs else None
        )
        replayed: dict[str, list[float | None]] = defaultdict(list)
        for job, trajectory in zip(replay_jobs, replays.trajectories if replays else [], strict=True):
            replayed[job.task.id].append(_credit(trajectory))
        # Probes: each one episode per task; any outcome credit is reward without the work.
        probe_jobs: list[RolloutJob] = []
        probe_of: dict[str, str] = {}
        if spec.probes:
            for probe in PROBES:
                for job in plan_groups(
                    chunk, 1, run_id=run_id, run_seed=spec.seed, step=index, kind=f"probe.{probe.name}"
                ):
                    probe_jobs.append(job)
                    probe_of[job.group_id] = probe.name
        starts = {p.name: p.start for p in PROBES}

        def probe_policy(job: RolloutJob, rollout_id: str) -> Policy:
            name = probe_of[job.group_id]
            return ScriptedPolicy(job.task, starts[name](job.task), name=name)

        probing = runner.with_policy(probe_policy, runner.provenance, EpisodeLimits(max_turns=PROBE_TURNS))
        probed = await probing.run(probe_jobs) if probe_jobs else None
        hits: dict[str, list[str]] = defaultdict(list)
        for job, trajectory in zip(probe_jobs, probed.trajectories if probed else [], strict=True):
            credit = _credit(trajectory)
            if credit is not None and credit > 0:
                hits[job.task.id].append(probe_of[job.group_id])
        self.writer.write(
            index,
            [*attempts.all(), *(replays.all() if replays else []), *(probed.all() if probed else [])],
        )
        screened = []
        for task in chunk:
            tried = [t for _, t in by_task[task.id]]
            kept = originals.get(task.id)
            outcomes = replayed.get(task.id, [])
            first = _credit(kept) if kept is not None else None
            screened.append(
                TaskScreen(
                    task.id,
                    task.family,
                    passes=sum(1 for t in tried if t.reward is not None and t.reward.success),
                    scored=sum(1 for t in tried if t.reward is not None),
                    attempts=len(tried),
                    flaky=any(o != first for o in outcomes),
                    replay_outcomes=((first, *outcomes),) if kept is not None and outcomes else (),
                    probe_hits=tuple(hits.get(task.id, [])),
                )
            )
        return screened

    def record_chunk(self, index: int, screened: Sequence[TaskScreen]) -> None:
        """The chunk's verdicts as one line: from here on, a resume skips it."""
        self.record.log_metrics(
            index, {"tasks": float(len(screened))}, stage=STAGE, screened=[s.to_json() for s in screened]
        )

    async def run(
        self, show_progress: bool = False, *, ray: str | None = None, workers: int = 1
    ) -> list[TaskScreen]:
        """Screen every chunk not on record: here, or on `workers` Ray actors at `ray`."""
        drop_damaged_steps(self.record)  # chunks whose records were damaged on disk are screened again
        done = self.done()
        self.sweep(done)
        todo = [i for i in range(len(self.chunks)) if i not in done]
        with progress_bar("screening", show_progress) as progress:
            bar = progress.add_task("tasks", total=len(self.tasks), completed=sum(len(done[i]) for i in done))
            if todo and ray is None:
                async with self.runner() as runner:
                    for index in todo:
                        done[index] = await self.sample_chunk(runner, index)
                        self.record_chunk(index, done[index])
                        progress.advance(bar, len(self.chunks[index]))
            elif todo:
                from reprorl.orchestrate.jobs.screen_ray import screen_on_ray

                async for index, screened in screen_on_ray(
                    self, todo, ray or "local", workers, worker_screener
                ):
                    done[index] = list(screened)
                    self.record_chunk(index, screened)
                    progress.advance(bar, len(self.chunks[index]))
        return [s for i in sorted(done) for s in done[i]]


def worker_screener(store: Store, spec: ScreenSpec, record: RunRecord) -> Screener:
    """The screener a Ray screen worker runs: the driver's, rebuilt in the worker's process."""
    _, tasks = screen_tasks(store, spec)
    return Screener(store, spec, record, tasks, families_named(t.family for t in tasks), None)


def screen_tasks(store: Store, spec: ScreenSpec) -> tuple[TaskSet, list[Task]]:
    taskset = load_taskset(store, spec.taskset)
    tasks = list(taskset.split(spec.split) if spec.split is not None else taskset.tasks)
    if not tasks:
        where = f" in split {spec.split.value}" if spec.split is not None else ""
        raise UserInputError(f"{spec.taskset} has no tasks{where} to screen", field="TASKSET")
    return taskset, tasks


def create_screen(store: Store, spec: ScreenSpec) -> RunRecord:
    """The record of a new screen of `spec` (its settings are the record's spec)."""
    taskset = store.resolve(spec.taskset)
    inputs = {"taskset": taskset.hash}
    if not is_script(spec.policy):
        base, _, adapter = spec.policy.partition("+")
        inputs["policy.base"] = store.resolve(base).hash
        if adapter:
            inputs["policy.adapter"] = store.resolve(adapter).hash
    name = taskset.version.name if taskset.version else "taskset"
    return RunRecord.create(
        store,
        spec=spec.record_spec(),
        spec_hash=spec.spec_hash(),
        name=f"screen-{name}",
        seeds={"root": spec.seed},
        inputs=inputs,
    )


def register_trainable(
    store: Store, spec: ScreenSpec, record: RunRecord, report: ScreenReport, name: str | None
) -> str | None:
    """The trainable subset as a new task-set version with its lineage; None when there is none."""
    keep = {t.task_id for t in report.trainable()}
    if not keep:
        return None
    source = load_taskset(store, spec.taskset)
    screened = store.resolve(spec.taskset)
    target = name or (screened.version.name if screened.version else source.name)
    subset = TaskSet(name=target, tasks=tuple(t for t in source.tasks if t.id in keep))
    meta = {
        "screened_from": screened.hash,
        "screen_run": record.run_id,
        "screen_spec_hash": spec.spec_hash(),
        "policy": spec.policy,
        "k": spec.k,
        "p": {t.task_id: t.p for t in report.trainable()},
    }
    version = store.add_bytes(target, subset.to_jsonl(), kind="taskset", meta=meta)
    registry = store.registry
    registry.link(version.hash, screened.hash, "screened_from", run_id=record.run_id)
    for role, address in record.info().get("inputs", {}).items():
        if role.startswith("policy."):
            registry.link(version.hash, address, "screened_with", run_id=record.run_id)
    return version.label


async def screen(
    store: Store,
    spec: ScreenSpec | None = None,
    *,
    resume: RunRecord | None = None,
    families: Mapping[str, Family] | None = None,
    scripted: ScriptedScreenPolicy | None = None,
    register_as: str | None = None,
    show_progress: bool = False,
    ray: str | None = None,
    workers: int = 1,
) -> tuple[RunRecord, ScreenReport]:
    """Screen `spec`'s task set (or continue `resume`, a killed screen) and register its trainable subset.

    With `ray` (a cluster address, or "local"), `workers` Ray actors screen whole chunks each, with
    the same runner settings, so the records are the ones one process would write.
    """
    if resume is not None:
        check_resumable(resume)
        spec = ScreenSpec.model_validate(resume.spec()["screen"])
    if spec is None:
        raise ValueError("give a screen spec, or a screen to resume")
    _, tasks = screen_tasks(store, spec)
    record = resume if resume is not None else create_screen(store, spec)
    record.set_status("running")
    try:
        chosen = families if families is not None else families_named(t.family for t in tasks)
        screener = Screener(store, spec, record, tasks, chosen, scripted)
        screened = await screener.run(show_progress, ray=ray, workers=workers)
        report = ScreenReport(tuple(screened), spec.k)
        label = register_trainable(store, spec, record, report, register_as)
        report = ScreenReport(report.tasks, spec.k, label, {"run_id": record.run_id, "policy": spec.policy})
        record.event("screened", counts=report.counts(), new_version=label)
    except BaseException as exc:
        record.set_status("failed", error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    record.set_status("succeeded")
    return record, report
