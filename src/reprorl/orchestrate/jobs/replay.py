"""Replay: re-executing one stored rollout from its record and finding the first thing that differs.

The policy is rebuilt from the record (the weights each turn's `policy_version` names, loaded and
checked by `replay_policy.py`, the sampling dtype and thread count) and every model turn is sampled
again inside the batch it was first sampled in: the other rows of that batch are rebuilt from their
own records (context tokens, seed, parameters), because floating-point results depend on the batch.
Two modes:

- *recorded*: each turn's context is taken from the record; checks the model side (tokens and
  logprobs, to the bit);
- *live*: the episode runs again in a fresh sandbox with the same env seed and task; tools and the
  verifier run for real, so it also checks tool results, the reward and the termination.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any, cast

from reprorl.config import RunSpec
from reprorl.config.load import stored_spec
from reprorl.envs.base import EnvConfig
from reprorl.envs.sandbox import SandboxPool
from reprorl.errors import NotFoundError, RecordError, UserInputError
from reprorl.hashing import derive_seed
from reprorl.orchestrate.jobs.replay_compare import (
    Difference,
    Mode,
    ReplayReport,
    compare_live,
    compare_sample,
)
from reprorl.orchestrate.jobs.replay_engine import EngineReplays
from reprorl.orchestrate.jobs.replay_policy import ReplayPolicies
from reprorl.orchestrate.run.judge_reward import run_judge
from reprorl.orchestrate.run.policies import OpenedPolicy
from reprorl.orchestrate.run.rollouts import episode_limits, load_taskset
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sample, SampleRequest
from reprorl.rewards import VerifierRunner
from reprorl.rollout.agents import AgentDriver, AgentProxy, agent_limits, resolve_program
from reprorl.rollout.episode import EpisodeIds, run_episode
from reprorl.rollout.families import get_family
from reprorl.rollout.judging import judged
from reprorl.rollout.model_policy import ModelPolicy
from reprorl.store import RunRecord, Store, find_run
from reprorl.store.rollout_query import RolloutStore
from reprorl.threads import off_loop
from reprorl.types import Alternative, Task, Trajectory, Turn, parse_sample_key, sample_key


def run_of(rollout_id: str) -> str:
    """Rollout ids begin with their run's id: `<run_id>/<kind>/<step>/<task_id>/<member>`."""
    run_id = rollout_id.split("/", 1)[0]
    if not run_id or run_id == rollout_id:
        raise UserInputError(f"{rollout_id!r} is not a rollout id (expected '<run_id>/…')")
    return run_id


def _sql_list(values: Iterable[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in sorted(set(values)))


class _Batches:
    """Rebuilds the batch of any recorded turn from the records of its rows (read as needed)."""

    def __init__(self, rollouts: RolloutStore, target: Trajectory) -> None:
        self.rollouts = rollouts
        self.records = {target.rollout_id: target}
        self._load(key.rsplit("/", 1)[0] for turn in target.turns for key in turn.batch)

    def _load(self, ids: Iterable[str]) -> None:
        missing = set(ids) - self.records.keys()
        if missing:
            found = self.rollouts.trajectories(f"rollout_id IN ({_sql_list(missing)})")
            self.records.update((t.rollout_id, t) for t in found)

    def _row(self, key: str) -> tuple[Trajectory, Turn | Alternative]:
        rollout_id, turn, choice = parse_sample_key(key)
        self._load([rollout_id])
        record = self.records.get(rollout_id)
        if record is None:
            raise RecordError(f"batch row {key!r} has no stored rollout; the batch cannot be rebuilt")
        row = record.turns[turn].row(choice) if turn < len(record.turns) else None
        if row is None or row.seed is None:
            raise RecordError(f"batch row {key!r}: the record has no such sampled turn")
        return record, row

    def requests(self, keys: Sequence[str], own: SampleRequest | None = None) -> list[SampleRequest]:
        self._load(key.rsplit("/", 1)[0] for key in keys)
        out = []
        for key in keys:
            if own is not None and key == own.key:
                # A live replay's own row: its context is the replay's, its cache reuse the record's
                # (none for a turn the record does not hold: the replay has already left it).
                try:
                    continues = self._continues(key, self._row(key)[1])
                except RecordError:
                    continues = None
                out.append(replace(own, continues=continues))
                continue
            record, row = self._row(key)
            turn = parse_sample_key(key)[1]
            continues = self._continues(key, row)
            out.append(
                SampleRequest(
                    key,
                    record.context_ids(turn),
                    record.sampling,
                    int(cast(int, row.seed)),
                    continues=continues,
                    keep=True,
                )
            )
        return out

    @staticmethod
    def _continues(key: str, row: Turn | Alternative) -> str | None:
        """A row that took its previous turn's kept cache takes it again; that turn's batch is re-run
        first (`Replayer._sample`)."""
        rollout_id, turn, _ = parse_sample_key(key)
        return sample_key(rollout_id, turn - 1) if isinstance(row, Turn) and row.reused else None

    def batch_of(self, key: str) -> tuple[str, ...]:
        """The keys of the batch the row `key` was sampled in."""
        return self._row(key)[1].batch


def find_task(store: Store, spec: RunSpec, target: Trajectory) -> Task:
    """The task the rollout ran, from the run's task sets, checked against the recorded hash."""
    refs = [str(spec.data.train), *(str(s) for s in spec.evaluation.suites)]
    for ref in refs:
        for task in load_taskset(store, ref).tasks:
            if task.id == target.task_id:
                if task.content_hash != target.task_hash:
                    raise RecordError(f"task {task.id!r} in {ref} does not match the recorded task hash")
                return task
    raise NotFoundError(f"task {target.task_id!r} is in none of the run's task sets")


def _check_conditions(report: ReplayReport, opened: OpenedPolicy, target: Trajectory) -> None:
    recorded, current = target.sampler.get("version"), opened.sampler.info().get("version")
    if recorded != current:
        report.differences.append(
            Difference("condition", None, None, f"sampler v{recorded}", f"sampler v{current}")
        )
    if opened.renderer.template_hash != target.prompt_template_hash:
        report.differences.append(
            Difference("condition", None, None, target.prompt_template_hash, opened.renderer.template_hash)
        )


class Replayer:
    """Replays rollouts of a store; policies and re-run batches are shared between replays.

    A batch re-run is a pure function of its requests (prompts, seeds, parameters) and the policy,
    so replaying several rollouts of one batch computes it once.
    """

    def __init__(self, store: Store, *, cached_batches: int = 256) -> None:
        self.store = store
        self.policies = ReplayPolicies(store)
        self._runs: dict[str, tuple[RunRecord, RolloutStore, RunSpec]] = {}
        self._batches: OrderedDict[tuple[Any, ...], list[Sample]] = OrderedDict()
        self._cached_batches = cached_batches
        self.batches_sampled = 0
        self.engines = EngineReplays()  # vLLM servers, for live replays of the rollouts they sampled

    def close(self) -> None:
        """Stop what the replays started (vLLM servers)."""
        self.engines.close()

    def _run(self, run_id: str) -> tuple[RunRecord, RolloutStore, RunSpec]:
        if run_id not in self._runs:
            record = find_run(self.store, run_id)
            self._runs[run_id] = (record, RolloutStore(record), stored_spec(record.spec()))
        return self._runs[run_id]

    async def _sample(
        self, opened: OpenedPolicy, requests: list[SampleRequest], batches: _Batches, *, again: bool = False
    ) -> list[Sample]:
        """The samples of a batch; a row that continues a kept cache has the batch that kept it re-run
        first, when the sampler no longer holds it. `again`: re-run even a batch sampled before."""
        version = opened.sampler.policy_version
        key = (id(opened), version, tuple((r.key, r.prompt_ids, r.seed, r.params) for r in requests))
        if key in self._batches and not again:
            self._batches.move_to_end(key)
            return self._batches[key]
        kept = getattr(opened.sampler, "kept", None)
        for request in requests:
            if request.continues is not None and kept is not None and request.continues not in kept:
                earlier = batches.requests(batches.batch_of(request.continues))
                await self._sample(opened, earlier, batches, again=True)
        samples = await off_loop(opened.sampler.sample, requests)
        self.batches_sampled += 1
        self._batches[key] = samples
        if len(self._batches) > self._cached_batches:
            self._batches.popitem(last=False)
        return samples

    async def replay(self, rollout_id: str, *, mode: Mode = "live") -> ReplayReport:
        """Re-execute `rollout_id` from its record; the report names the first difference, if any."""
        record, rollouts, spec = self._run(run_of(rollout_id))
        target = rollouts.get(rollout_id)
        if not target.turns or target.turns[0].seed is None:
            raise UserInputError(f"rollout {rollout_id!r} was not sampled by a model (nothing to replay)")
        kind = target.sampler.get("kind")
        if kind == "vllm":
            return await self._engine_sampled(spec, target, rollout_id, record, mode)
        if kind != "local":
            raise UserInputError(
                f"rollout {rollout_id!r} was sampled by {kind!r} inference, which does not report its "
                "batches; only rollouts sampled in-process (model.inference unset) replay bit for bit"
            )

        def opened_for(turn: int) -> OpenedPolicy:
            version = target.turns[min(turn, len(target.turns) - 1)].policy_version
            return self.policies.for_turn(record, spec, target, version)

        report = ReplayReport(rollout_id, mode)
        _check_conditions(report, opened_for(0), target)
        batches = _Batches(rollouts, target)
        if mode == "recorded":
            for turn in target.turns:
                for row in turn.sampled_rows():
                    samples = await self._sample(opened_for(turn.index), batches.requests(row.batch), batches)
                    own = sample_key(rollout_id, turn.index, row.choice)
                    compare_sample(report, turn.index, target, next(s for s in samples if s.key == own))
            return report

        async def submit(request: SampleRequest) -> tuple[Sample, float]:
            _, turn, choice = parse_sample_key(request.key)
            row = target.turns[turn].row(choice) if turn < len(target.turns) else None
            keys = row.batch if row is not None else (request.key,)
            samples = await self._sample(opened_for(turn), batches.requests(keys, own=request), batches)
            sample = next(s for s in samples if s.key == request.key)
            if turn < len(target.turns):
                compare_sample(report, turn, target, sample)
            return sample, 0.0

        live = await self._live(spec, target, opened_for(0).renderer, submit)
        compare_live(report, target, live)
        return report

    async def _engine_sampled(
        self, spec: RunSpec, target: Trajectory, rollout_id: str, record: RunRecord, mode: Mode
    ) -> ReplayReport:
        """A rollout vLLM sampled. vLLM does not say how it batched a request, so its tokens cannot
        be drawn again bit for bit. Recorded mode: the recorded tokens stand in for the model and the
        episode runs again on them (tools, verifier, reward compared to the record). Live mode: the
        run's engine is started again with each turn's adapter, every turn is asked anew with its
        recorded seed and parameters, and the report gives the share of recorded tokens drawn again
        (turns whose context still matches the record) beside the first difference."""
        version = target.turns[0].policy_version
        renderer = self.policies.for_turn(record, spec, target, version).renderer
        if mode == "live":
            report = ReplayReport(rollout_id, mode)

            async def asked(request: SampleRequest) -> tuple[Sample, float]:
                _, index, _choice = parse_sample_key(request.key)
                turn = target.turns[min(index, len(target.turns) - 1)]
                sampler = await off_loop(self.engines.sampler, record, spec, turn.policy_version)
                (sample,) = await off_loop(sampler.sample, [request])
                self.batches_sampled += 1  # vLLM is asked one request at a time: a batch of one
                if index < len(target.turns) and request.prompt_ids == target.context_ids(index):
                    compare_sample(report, index, target, sample)
                return sample, 0.0

            live = await self._live(spec, target, renderer, asked)
            compare_live(report, target, live)
            return report
        report = ReplayReport(
            rollout_id, mode, len(target.turns), sum(len(t.token_ids) for t in target.turns)
        )

        async def recorded(request: SampleRequest) -> tuple[Sample, float]:
            _, index, _choice = parse_sample_key(request.key)
            if index >= len(target.turns):
                raise RecordError(f"the replay of {rollout_id} asked for turn {index}, which it never had")
            turn = target.turns[index]
            return Sample(
                key=request.key,
                token_ids=turn.token_ids,
                logprobs=turn.logprobs,
                finish_reason="stop" if turn.finish_reason == "error" else turn.finish_reason,
                text=turn.text,
                policy_version=turn.policy_version,
            ), 0.0

        live = await self._live(spec, target, renderer, recorded)
        compare_live(report, target, live)
        return report

    async def _live(
        self,
        spec: RunSpec,
        target: Trajectory,
        renderer: ChatRenderer,
        submit: Callable[[SampleRequest], Awaitable[tuple[Sample, float]]],
    ) -> Trajectory:
        task = find_task(self.store, spec, target)
        family = get_family(task.family)
        async with AsyncExitStack() as stack:
            policy: ModelPolicy | AgentDriver = ModelPolicy(
                submit, renderer, target.sampling, target.rollout_id
            )
            modules, limits, network = list(family.tool_modules), None, True
            sys_path: tuple[str, ...] = ()
            if spec.agent is not None:  # the agent runs again, through a proxy of the replay's own
                program = resolve_program(spec.agent)
                proxy = await stack.enter_async_context(AgentProxy())
                policy = AgentDriver(program, proxy, renderer, submit, target.sampling, target.rollout_id)
                modules += program.modules
                limits, network, sys_path = agent_limits(None, program), False, program.sys_path
            sandboxes = await stack.enter_async_context(
                SandboxPool(modules, limits=limits, network=network, sys_path=sys_path)
            )
            verifiers = await stack.enter_async_context(VerifierRunner())
            live = await run_episode(
                family.env(EnvConfig.from_spec(spec.data), seed=derive_seed(target.sampling.seed, "env")),
                task,
                policy,
                verifier=family.verifier,
                cross=family.cross,
                sandboxes=sandboxes,
                verifiers=verifiers,
                ids=EpisodeIds(target.run_id, target.rollout_id, target.group_id, target.sampling.seed),
                limits=episode_limits(spec),
                weights=spec.data.reward_weights,
                sampling=target.sampling,
            )
        judge = run_judge(spec, self.store.root)
        if judge is None:
            return live
        try:  # its replies are cached: an unchanged rollout is judged from the cache, asking nothing
            return await judged(judge, task, live, spec.data.reward_weights)
        finally:
            judge.close()


async def replay(store: Store, rollout_id: str, *, mode: Mode = "live") -> ReplayReport:
    """Replay one rollout (see `Replayer` to replay many)."""
    replayer = Replayer(store)
    try:
        return await replayer.replay(rollout_id, mode=mode)
    finally:
        replayer.close()
