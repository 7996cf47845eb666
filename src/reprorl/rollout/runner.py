"""The rollout runner: groups of G episodes per task, run concurrently against one sampler.

The runner spreads jobs (`reprorl.rollout.jobs`: seeded per task and member) over `concurrency`
lanes; each lane runs its jobs one after another, and the lanes' model turns are batched in lockstep
(`reprorl.rollout.model_policy`), whose turns wait for each other as the barrier says
(`reprorl.rollout.barriers`).

An infrastructure failure (the sandbox would not start, the sampler raised) is not the agent's: the
episode is run again from the start, up to `max_infra_retries` times. The failed attempt is kept as
its own record with `retried=True`, and the rollout that counts carries `infra_retries`. An attempt
runs under the id `<rollout_id>~<attempt>` after the first, so every record's id is unique.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Self

from reprorl.config.spec import PriceTable
from reprorl.envs.base import EnvConfig
from reprorl.envs.sandbox import SandboxLimits, SandboxPool
from reprorl.errors import UserInputError
from reprorl.hashing import derive_seed
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sampler
from reprorl.rewards import VerifierRunner
from reprorl.rewards.isolation import DEFAULT_TIMEOUT_S
from reprorl.rollout.agents import AgentDriver, AgentProgram, AgentProxy, agent_limits
from reprorl.rollout.barriers import BARRIERS, Barrier, BatchBarrier, GroupBarrier, ReadyBarrier
from reprorl.rollout.episode import Driver, EpisodeIds, EpisodeLimits, Policy, Provenance, run_episode
from reprorl.rollout.families import FAMILIES, Family
from reprorl.rollout.jobs import PolicyFactory, RolloutJob, plan_groups
from reprorl.rollout.judging import RewardJudge, judged
from reprorl.rollout.model_policy import Gate, ModelPolicy
from reprorl.types import SamplingParams, Split, Task, Termination, Trajectory

__all__ = [
    "BARRIERS",
    "Barrier",
    "BatchBarrier",
    "GroupBarrier",
    "PolicyFactory",
    "ReadyBarrier",
    "RolloutJob",
    "RolloutResult",
    "RolloutRunner",
    "plan_groups",
]


@dataclass
class RolloutResult:
    """The rollouts that count (in job order) and the infra-failed attempts that were retried."""

    trajectories: list[Trajectory]
    retried: list[Trajectory] = field(default_factory=list)

    def all(self) -> list[Trajectory]:
        """Every record, failed attempts included: what the rollout store keeps."""
        return [*self.trajectories, *self.retried]


class RolloutRunner:
    """Policy and env to trajectories, for many episodes at once; an async context manager."""

    def __init__(
        self,
        sampler: Sampler | None,
        renderer: ChatRenderer | None,
        *,
        run_id: str,
        params: SamplingParams,
        provenance: Provenance,
        limits: EpisodeLimits | None = None,
        families: Mapping[str, Family] = FAMILIES,
        env_config: EnvConfig | None = None,
        reward_weights: Mapping[str, float] | None = None,
        prices: PriceTable | None = None,
        concurrency: int = 32,
        max_batch: int = 32,
        max_infra_retries: int = 2,
        sandbox_limits: SandboxLimits | None = None,
        check_prefix: bool = True,
        judge: RewardJudge | None = None,
        barrier: Barrier | None = None,
        verifier_timeout_s: float = DEFAULT_TIMEOUT_S,
        agent: AgentProgram | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.sampler, self.renderer, self.run_id, self.params = sampler, renderer, run_id, params
        self.provenance = provenance
        self.limits = limits or EpisodeLimits()
        self.families = dict(families)
        self.env_config = env_config or EnvConfig()
        self.reward_weights = dict(reward_weights) if reward_weights else None
        self.prices = prices or PriceTable()
        self.concurrency, self.max_batch = concurrency, max_batch
        self.max_infra_retries = max_infra_retries
        self.sandbox_limits = sandbox_limits
        self.check_prefix = check_prefix
        self.judge = judge
        self.verifier_timeout_s = verifier_timeout_s
        self.barrier = barrier or BatchBarrier()
        self.agent = agent
        self._proxy: AgentProxy | None = None
        self._stack: AsyncExitStack | None = None
        self._sandboxes: SandboxPool | None = None
        self._verifiers: VerifierRunner | None = None
        self.policy_for: PolicyFactory | None = None

    @property
    def sandboxes(self) -> SandboxPool:
        """The sandbox pool of the open runner (its limits are the ones episodes get)."""
        if self._sandboxes is None:
            raise RuntimeError("the runner is not open")
        return self._sandboxes

    @property
    def verifiers(self) -> VerifierRunner:
        """The verifier pool of the open runner (its time limit is the one verifier calls get)."""
        if self._verifiers is None:
            raise RuntimeError("the runner is not open")
        return self._verifiers

    async def __aenter__(self) -> Self:
        modules = sorted({m for f in self.families.values() for m in f.tool_modules})
        limits, network_namespace = self.sandbox_limits, True
        sys_path: tuple[str, ...] = ()
        if self.agent is not None:
            modules = sorted({*modules, *self.agent.modules})
            limits = agent_limits(self.sandbox_limits, self.agent)
            # The agent reaches the proxy on the host's loopback, so it shares the host's network.
            network_namespace, sys_path = False, self.agent.sys_path
        async with AsyncExitStack() as stack:
            self._sandboxes = await stack.enter_async_context(
                SandboxPool(modules, limits=limits, network=network_namespace, sys_path=sys_path)
            )
            if self.agent is not None:
                self._proxy = await stack.enter_async_context(AgentProxy())
            self._verifiers = await stack.enter_async_context(
                VerifierRunner(timeout_s=self.verifier_timeout_s)
            )
            if self.judge is not None:
                stack.callback(self.judge.close)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None

    def with_policy(
        self, policy_for: PolicyFactory, provenance: Provenance, limits: EpisodeLimits | None = None
    ) -> RolloutRunner:
        """This runner with each episode's policy made by `policy_for(job, rollout_id)` (a script, an
        exploit probe, a replay) instead of sampled from the model; `limits` replaces the episode
        limits (a probe may need more turns than the policy it stands in for is given)."""
        if self._sandboxes is None:
            raise RuntimeError("use the runner as `async with RolloutRunner(...) as runner`")
        view = copy.copy(self)
        view.policy_for, view.provenance = policy_for, provenance
        view.limits = limits or self.limits
        view._stack = None
        return view

    def with_sampler(self, sampler: Sampler, provenance: Provenance) -> RolloutRunner:
        """This runner (its open sandboxes and verifiers, its settings) sampling from another policy.

        Batches from different policy versions run at once this way, each in its own lockstep.
        """
        if self._sandboxes is None:
            raise RuntimeError("use the runner as `async with RolloutRunner(...) as runner`")
        view = copy.copy(self)
        view.sampler, view.provenance = sampler, provenance
        view._stack = None  # the view closes nothing: the original owns the pools
        return view

    async def run(
        self, jobs: Sequence[RolloutJob], *, on_done: Callable[[Trajectory], None] | None = None
    ) -> RolloutResult:
        """Run every job; never raises for a failed rollout (the failure is in its record)."""
        if self._sandboxes is None:
            raise RuntimeError("use the runner as `async with RolloutRunner(...) as runner`")
        for job in jobs:  # bad tasks are the caller's error: say so before any episode starts
            self._check_task(job.task)
        if self.sampler is None and self.policy_for is None:
            raise RuntimeError("a runner without a sampler runs scripted policies only (with_policy)")
        finals: list[Trajectory | None] = [None] * len(jobs)
        retried: list[list[Trajectory]] = [[] for _ in jobs]
        parts, at_once = self.barrier.parts(jobs, self.concurrency)
        slots = asyncio.Semaphore(at_once)

        async def run_part(part: list[int]) -> None:
            async with slots:
                await self._run_lanes(jobs, part, finals, retried, on_done)

        await asyncio.gather(*(run_part(part) for part in parts))
        return RolloutResult(
            trajectories=[t for t in finals if t is not None],
            retried=[t for attempts in retried for t in attempts],
        )

    async def _run_lanes(
        self,
        jobs: Sequence[RolloutJob],
        part: list[int],
        finals: list[Trajectory | None],
        retried: list[list[Trajectory]],
        on_done: Callable[[Trajectory], None] | None,
    ) -> None:
        """The jobs `part` names, on lanes of their own whose model turns share one lockstep."""
        priority = min(jobs[i].priority for i in part)
        lockstep = None
        if self.sampler is not None:
            lockstep = self.barrier.lockstep(self.sampler, self.max_batch, priority)
        lanes = min(self.concurrency, len(part))
        for lane in range(lanes):
            if lockstep is not None:
                lockstep.join(lane)

        async def run_lane(lane: int) -> None:
            try:
                for index in part[lane::lanes]:
                    finals[index] = await self._with_retries(jobs[index], lane, lockstep, retried[index])
                    if on_done is not None:
                        on_done(finals[index])  # type: ignore[arg-type]
            finally:
                if lockstep is not None:
                    lockstep.leave(lane)

        await asyncio.gather(*(run_lane(lane) for lane in range(lanes)))

    def lost(self, job: RolloutJob, rollout_id: str, error: str) -> Trajectory:
        """The record of an attempt the platform lost before it could report (a worker died).

        It is an infra failure, marked `retried`: the job runs again, and this record says why.
        """
        env = self._family(job.task).env(self.env_config, seed=derive_seed(job.seed, "env"))
        return Trajectory(
            run_id=self.run_id,
            rollout_id=rollout_id,
            group_id=job.group_id,
            split=job.task.split if isinstance(job.task.split, Split) else Split(job.task.split),
            task_id=job.task.id,
            task_hash=job.task.content_hash,
            env_version=type(env).version(env.config),
            tool_versions={t.name: t.version for t in env.tools},
            prompt_template_hash=self.provenance.prompt_template_hash,
            base_model_hash=self.provenance.base_model_hash,
            adapter_version=self.provenance.adapter_version,
            sampler=self.provenance.sampler,
            sampling=(job.params or self.params).model_copy(update={"seed": job.seed}),
            step=job.step,
            member=job.member,
            termination=Termination.INFRA_ERROR,
            error=error,
            retried=True,
        )

    def _family(self, task: Task) -> Family:
        try:
            return self.families[task.family]
        except KeyError:
            raise UserInputError(
                f"task {task.id!r}: no env family {task.family!r}; "
                f"families: {', '.join(sorted(self.families))}"
            ) from None

    def _check_task(self, task: Task) -> None:
        offered = {t.name for t in self._family(task).env.tools}
        missing = sorted(set(task.tools) - offered)
        if missing:
            raise UserInputError(
                f"task {task.id!r}: tools {missing} are not tools of the {task.family!r} env "
                f"(it has {sorted(offered)}); fix the task's 'tools' list"
            )

    async def _with_retries(
        self, job: RolloutJob, lane: int, lockstep: Gate | None, failed: list[Trajectory]
    ) -> Trajectory:
        attempt = 0
        while True:
            rollout_id = job.rollout_id if attempt == 0 else f"{job.rollout_id}~{attempt}"
            trajectory = await self._episode(job, rollout_id, lane, lockstep)
            if trajectory.termination is not Termination.INFRA_ERROR or attempt >= self.max_infra_retries:
                return trajectory.model_copy(update={"infra_retries": attempt})
            failed.append(trajectory.model_copy(update={"retried": True, "infra_retries": attempt}))
            attempt += 1

    async def _episode(
        self, job: RolloutJob, rollout_id: str, lane: int, lockstep: Gate | None
    ) -> Trajectory:
        assert self._sandboxes is not None and self._verifiers is not None
        family, params = self._family(job.task), job.params or self.params
        policy: Policy | Driver
        if self.policy_for is not None:
            policy = self.policy_for(job, rollout_id)
        elif self.agent is not None:
            assert lockstep is not None and self.renderer is not None and self._proxy is not None
            policy = AgentDriver(
                self.agent,
                self._proxy,
                self.renderer,
                partial(lockstep.sample, lane),
                params,
                rollout_id,
            )
        else:
            assert lockstep is not None and self.renderer is not None
            policy = ModelPolicy(
                partial(lockstep.sample, lane),
                self.renderer,
                params,
                rollout_id,
                check_prefix=self.check_prefix,
            )
        trajectory = await run_episode(
            family.env(self.env_config, seed=derive_seed(job.seed, "env")),
            job.task,
            policy,
            verifier=family.verifier,
            cross=family.cross,
            sandboxes=self._sandboxes,
            verifiers=self._verifiers,
            ids=EpisodeIds(
                self.run_id, rollout_id, job.group_id, seed=job.seed, step=job.step, member=job.member
            ),
            limits=self.limits,
            weights=self.reward_weights,
            sampling=params,
            provenance=self.provenance,
        )
        cost = self.prices.cost(trajectory.prompt_tokens, trajectory.completion_tokens, trajectory.cpu_s)
        trajectory = trajectory.model_copy(update={"cost_usd": cost})
        if self.judge is None:
            return trajectory
        return await judged(self.judge, job.task, trajectory, self.reward_weights)
