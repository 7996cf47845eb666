"""One episode: a policy acting in a fresh env and sandbox, scored by an isolated verifier.

Every way an episode can go wrong ends in a `Trajectory` with a termination reason and the details,
never in an exception: the model's bad output, a tool's failure, a dead sandbox, a verifier that
hangs, a policy server that stops answering. Limits on turns, tokens and wall time are enforced here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from reprorl.actions import parse_action
from reprorl.envs.base import ToolEnv
from reprorl.envs.sandbox import SandboxPool
from reprorl.hashing import derive_seed
from reprorl.rewards import FinalState, Verifier, VerifierRunner, compose, process_components, step_scores
from reprorl.threads import off_loop
from reprorl.types import (
    NOT_SCORED,
    Message,
    Role,
    SamplingParams,
    ScoreFailure,
    Split,
    Task,
    Termination,
    Trajectory,
    Turn,
)


@dataclass(frozen=True)
class PolicyOutput:
    """One sampled reply: its text, and (for model policies) its tokens and their logprobs."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()
    policy_version: str = ""
    finish_reason: str = "stop"
    seed: int | None = None
    batch: tuple[str, ...] = ()
    rerender_ok: bool | None = None
    cpu_s: float = 0.0
    reused: int = 0  # positions of the context the sampler took from the previous turn's kept cache


class Policy(Protocol):
    """Anything that answers a conversation: a model, a server, a script."""

    async def act(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], *, seed: int
    ) -> PolicyOutput: ...


Script = Callable[[Task, Sequence[Message]], str]


class ScriptedPolicy:
    """A policy that follows a script; oracles and probes use it (a script may read the task)."""

    def __init__(self, task: Task, script: Script, name: str = "scripted") -> None:
        self.task, self.script, self.name = task, script, name

    async def act(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], *, seed: int
    ) -> PolicyOutput:
        return PolicyOutput(text=self.script(self.task, messages), policy_version=f"script:{self.name}")


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits; reaching one ends the episode with the matching termination."""

    max_turns: int = 8
    max_tokens: int = 4096
    wall_s: float = 120.0


@dataclass(frozen=True)
class EpisodeIds:
    """Where the episode sits in the run; `seed` is the member's own, derived from the run's."""

    run_id: str
    rollout_id: str
    group_id: str = ""
    seed: int = 0
    step: int = 0
    member: int = 0


@dataclass(frozen=True)
class Provenance:
    """Which model, adapter, template and sampler the policy is; copied onto every trajectory."""

    base_model_hash: str = ""
    adapter_version: str | None = None
    prompt_template_hash: str = ""
    sampler: dict[str, Any] = field(default_factory=dict)


def turn_seed(episode_seed: int, turn: int) -> int:
    """Each turn's sampling seed: distinct per turn, a pure function of the member's seed."""
    return derive_seed(episode_seed, "turn", turn)


@dataclass
class Progress:
    """What an episode has done so far: its turns, counts and (once it ends) why it ended."""

    turns: list[Turn] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cpu_s: float = 0.0
    termination: Termination | None = None
    error: str | None = None
    score_failure: ScoreFailure | None = None


@runtime_checkable
class Driver(Protocol):
    """Who acts in an opened episode: reprorl's own tool loop over a `Policy`, or an agent program."""

    async def drive(
        self,
        env: ToolEnv,
        task: Task,
        ids: EpisodeIds,
        limits: EpisodeLimits,
        progress: Progress,
        sandbox: Any,
    ) -> None:
        """Start the env and act until the episode ends, recording into `progress`."""
        ...

    def info(self) -> dict[str, Any]:
        """What the trajectory records of the driver (`Trajectory.agent`; empty for the tool loop)."""
        ...


@dataclass(frozen=True)
class PolicyLoop:
    """reprorl's own loop: the policy answers, its tool calls run in the env, until an end."""

    policy: Policy

    async def drive(
        self,
        env: ToolEnv,
        task: Task,
        ids: EpisodeIds,
        limits: EpisodeLimits,
        progress: Progress,
        sandbox: Any,
    ) -> None:
        await _loop(env, task, self.policy, ids, limits, progress, sandbox)

    def info(self) -> dict[str, Any]:
        return {}


async def run_episode(
    env: ToolEnv,
    task: Task,
    policy: Policy | Driver,
    *,
    verifier: Verifier,
    sandboxes: SandboxPool,
    verifiers: VerifierRunner,
    ids: EpisodeIds,
    limits: EpisodeLimits | None = None,
    weights: dict[str, float] | None = None,
    sampling: SamplingParams | None = None,
    provenance: Provenance | None = None,
    cross: Sequence[Verifier] = (),
) -> Trajectory:
    """Run `policy` on `task` in `env` and return the complete record, whatever happens.

    `policy` is a `Policy` answering in reprorl's own tool loop, or a `Driver` (an agent program
    behind the proxy) that acts in the episode its own way.

    `cross` verifiers score the same final state after `verifier` did; each adds its pass (1.0) or
    fail (0.0) as the component `cross/<class name>`, which no weight covers, so the total and success
    stay the primary's. One that fails to score adds nothing. The reward's version names them all
    (`scored_by`).
    """
    limits = limits or EpisodeLimits()
    provenance = provenance or Provenance()
    driver = policy if isinstance(policy, Driver) else PolicyLoop(policy)
    started = time.perf_counter()
    progress = Progress()
    reward = None
    sandbox_info: dict[str, Any] = {}
    try:
        async with sandboxes.open() as sandbox:
            sandbox_info = sandbox.info()
            try:
                async with asyncio.timeout(limits.wall_s):
                    await driver.drive(env, task, ids, limits, progress, sandbox)
            except TimeoutError:
                progress.termination = Termination.MAX_WALL_TIME
            await sandbox.freeze()  # nothing the agent started may change the state being judged
            sandbox_info = sandbox.info()
            if progress.termination not in NOT_SCORED:
                termination = progress.termination or Termination.INFRA_ERROR
                state = FinalState(
                    env.final_answer,
                    sandbox.workdir,
                    termination,
                    env.reported,
                    env.env_state,
                    transcript(task, progress.turns),
                )
                # A link, FIFO, socket or device in the final state is the agent's doing (no built-in
                # env leaves one): scored 0 at once, before a verifier could block on it or follow it,
                # or an agent would learn to dodge bad rewards by breaking its verifier.
                planted = await off_loop(state.special_entries)
                if planted:
                    components, failure = None, None
                    progress.score_failure = ScoreFailure.AGENT_STATE
                    progress.error = f"the final state holds what no file may be: {', '.join(planted[:5])}"
                else:
                    components, failure = await verifiers.score(verifier, task, state)
                if failure is not None:
                    progress.error, progress.score_failure = failure.message, failure.kind
                if progress.score_failure is ScoreFailure.AGENT_STATE:
                    reward = compose({verifier.name: 0.0}, {verifier.name: 1.0}, scored_by(verifier))
                elif components is not None:
                    components.update(await _cross_check(cross, task, state, verifiers))
                    if termination == Termination.UNSAFE_ACTION:
                        # No credit for a state reached by damage, from any verifier: a cross check
                        # must disagree about the state, not about this rule.
                        components[verifier.name] = 0.0
                        components.update({name: 0.0 for name in components if name.startswith(CROSS)})
                    components.update(process_components(progress.turns))
                    reward = compose(components, weights or {"outcome": 1.0}, scored_by(verifier, cross))
    except Exception as exc:  # the platform failed (sandbox could not start, policy server down)
        progress.termination = Termination.INFRA_ERROR
        progress.error = f"{type(exc).__name__}: {str(exc)[:500]}"
    finally:
        with contextlib.suppress(Exception):  # an external env's session ends with its episode
            await env.close()
    return Trajectory(
        run_id=ids.run_id,
        rollout_id=ids.rollout_id,
        group_id=ids.group_id,
        split=task.split if isinstance(task.split, Split) else Split(task.split),
        task_id=task.id,
        task_hash=task.content_hash,
        env_version=type(env).version(env.config),
        tool_versions={t.name: t.version for t in env.tools},
        policy_version=progress.turns[-1].policy_version if progress.turns else "",
        prompt_template_hash=provenance.prompt_template_hash,
        base_model_hash=provenance.base_model_hash,
        adapter_version=provenance.adapter_version,
        sampler=provenance.sampler,
        sampling=(sampling or SamplingParams()).model_copy(update={"seed": ids.seed}),
        step=ids.step,
        member=ids.member,
        turns=tuple(progress.turns),
        reward=reward,
        process_rewards=step_scores(progress.turns),
        termination=progress.termination or Termination.INFRA_ERROR,
        error=progress.error,
        score_failure=progress.score_failure,
        completion_tokens=progress.completion_tokens,
        prompt_tokens=progress.prompt_tokens,
        cpu_s=progress.cpu_s,
        wall_s=time.perf_counter() - started,
        sandbox=sandbox_info,
        agent=driver.info(),
        env=_env_info(env),
    )


CROSS = "cross/"


def _env_info(env: ToolEnv) -> dict[str, Any]:
    try:
        return env.info()
    except Exception as exc:  # the record is written whatever the env can say of itself
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def transcript(task: Task, turns: Sequence[Turn]) -> tuple[Message, ...]:
    """The episode's conversation from its record: the prompt, each reply, each tool result."""
    messages = list(task.prompt)
    for turn in turns:
        messages.append(Message(role=Role.ASSISTANT, content=turn.text))
        for result in turn.tool_results:
            content = (
                result.content if result.error is None else f"error ({result.outcome.value}): {result.error}"
            )
            messages.append(
                Message(
                    role=Role.TOOL, content=content, tool_call_id=result.call_id, name=result.name or None
                )
            )
    return tuple(messages)


def scored_by(verifier: Verifier, cross: Sequence[Verifier] = ()) -> str:
    """The reward's `verifier_version`: the verifier's, then each cross verifier's as `+cross:<class>@<hash>`,
    so a change to any scorer of a rollout shows in its record."""
    return verifier.version + "".join(f"+{CROSS}{type(c).__name__}@{c.version}" for c in cross)


async def _cross_check(
    cross: Sequence[Verifier], task: Task, state: FinalState, verifiers: VerifierRunner
) -> dict[str, float]:
    """Each cross verifier's verdict on the final state; one that fails is left out, never raised."""
    verdicts: dict[str, float] = {}
    for other in cross:
        components, _ = await verifiers.score(other, task, state)
        if components is not None and other.name in components:
            verdicts[f"{CROSS}{type(other).__name__}"] = float(components[other.name] >= 1.0)
    return verdicts


async def _loop(
    env: ToolEnv,
    task: Task,
    policy: Policy,
    ids: EpisodeIds,
    limits: EpisodeLimits,
    progress: Progress,
    sandbox: Any,
) -> None:
    observation = await env.start(task, sandbox)
    messages = list(observation.messages)
    for index in range(limits.max_turns):
        sample_start = time.perf_counter()
        output = await policy.act(messages, observation.tools, seed=turn_seed(ids.seed, index))
        sample_s = time.perf_counter() - sample_start
        progress.completion_tokens += len(output.token_ids)
        progress.prompt_tokens += len(output.prompt_token_ids)
        progress.cpu_s += output.cpu_s
        action = parse_action(output.text, turn_id=f"{ids.rollout_id}.{index}")
        tool_start = time.perf_counter()
        step = await env.step(action)
        progress.turns.append(
            Turn(
                index=index,
                prompt_token_ids=output.prompt_token_ids,
                token_ids=output.token_ids,
                logprobs=output.logprobs,
                text=output.text,
                tool_calls=action.tool_calls,
                tool_results=step.tool_results,
                policy_version=output.policy_version,
                seed=output.seed,
                batch=output.batch,
                reused=output.reused,
                rerender_ok=output.rerender_ok,
                finish_reason="tool_call"
                if action.tool_calls
                else ("length" if output.finish_reason == "length" else "stop"),
                sample_s=sample_s,
                tool_s=time.perf_counter() - tool_start,
            )
        )
        messages.append(Message(role=Role.ASSISTANT, content=output.text))
        messages.extend(step.observation)
        if step.done:
            progress.termination = step.termination
            return
        if progress.completion_tokens >= limits.max_tokens:
            progress.termination = Termination.MAX_TOKENS
            return
    progress.termination = Termination.MAX_TURNS
