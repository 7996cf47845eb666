"""Environments: single-use episodes that turn the agent's actions into tool calls and observations.

An `Env` instance serves exactly one episode: `start(task, sandbox)` builds the initial state in the
sandbox and returns the first observation; `step(action)` runs the action's tool calls and says
whether the episode is over and why. There is no reset: a new episode is a new instance.
`ToolEnv` is the common case: a family declares its tools, how to build the task's initial state,
and its verifier; the base class does validation, permissions, noise, truncation and the failure
taxonomy, so a new family stays small.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from reprorl.actions import Action
from reprorl.config.spec import DataSpec, NoiseSpec
from reprorl.envs.calls import CallOutcome, classify_call
from reprorl.envs.mcp_remote import RemoteSessions
from reprorl.envs.noise import NoiseInjector
from reprorl.envs.sandbox import Sandbox, SandboxError
from reprorl.envs.tool import Tool
from reprorl.hashing import code_fingerprint, content_hash
from reprorl.types import Message, Permission, Role, Task, Termination, ToolOutcome, ToolResult

DEFAULT_ALLOWED = frozenset({Permission.READ, Permission.WRITE, Permission.HUMAN})


@dataclass(frozen=True)
class Observation:
    """What the agent sees at the start: the prompt messages and the tools it may call."""

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class StepResult:
    """The outcome of one action: tool messages to append, results, and whether the episode ended."""

    observation: tuple[Message, ...]
    tool_results: tuple[ToolResult, ...]
    done: bool
    termination: Termination | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvConfig:
    """Settings of an environment that change what the agent experiences (part of its version)."""

    tool_output_chars: int = 4096
    max_invalid_actions: int = 3
    noise: NoiseSpec = field(default_factory=NoiseSpec)
    allowed: frozenset[Permission] = DEFAULT_ALLOWED

    @classmethod
    def from_spec(cls, data: DataSpec) -> EnvConfig:
        """The env settings a run spec's `data` section asks for."""
        return cls(
            tool_output_chars=data.tool_output_chars,
            max_invalid_actions=data.max_invalid_actions,
            noise=data.noise,
            allowed=frozenset(Permission(p) for p in data.tool_permissions),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "tool_output_chars": self.tool_output_chars,
            "max_invalid_actions": self.max_invalid_actions,
            # A field added later is left out at its default, so earlier env versions keep their hash.
            "noise": self.noise.model_dump(
                mode="json", exclude={"latency_sigma"} if self.noise.latency_sigma == 0 else None
            ),
            "allowed": sorted(p.value for p in self.allowed),
        }


class Env(ABC):
    """One episode of an environment family."""

    family: ClassVar[str]

    @abstractmethod
    async def start(self, task: Task, sandbox: Sandbox) -> Observation: ...

    @abstractmethod
    async def step(self, action: Action) -> StepResult: ...

    @property
    @abstractmethod
    def final_answer(self) -> str | None:
        """The agent's answer once the episode ended with one."""

    @property
    def reported(self) -> dict[str, float] | None:
        """What an external env reported of the episode itself (an OpenEnv server's rewards), which
        its verifier scores; None for an env whose outcome is read from the final state."""
        return None

    @property
    def env_state(self) -> str | None:
        """The state an external env's own code keeps of the episode, as JSON (a verifiers rollout's
        `State`), which its verifier reads; None for an env whose state is its files."""
        return None

    async def close(self) -> None:
        """Release what the episode held outside its sandbox (an external env's session); idempotent."""
        return None

    def info(self) -> dict[str, Any]:
        """What the trajectory records of an external env's identity (`Trajectory.env`); empty here."""
        return {}


class ToolEnv(Env):
    """An env family whose agent acts by calling tools; subclasses declare `family` and `tools`."""

    tools: ClassVar[tuple[Tool, ...]]
    system_prompt: ClassVar[str | None] = None
    setup_fn: ClassVar[Callable[..., str] | None] = None
    """A module-level `fn(ctx, setup) -> str` run in the sandbox to build `task.setup`'s state."""
    setup_timeout_s: ClassVar[float] = 30.0

    def __init__(self, config: EnvConfig | None = None, *, seed: int = 0) -> None:
        self.config = config or EnvConfig()
        self.noise = NoiseInjector(self.config.noise, seed)
        self.by_name = {t.name: t for t in self.tools}
        self.counts: Counter[tuple[str, ToolOutcome]] = Counter()
        self.human_calls = 0
        self._sandbox: Sandbox | None = None
        self._task: Task | None = None
        self._invalid_streak = 0
        self._answer: str | None = None
        self._remote: RemoteSessions | None = None  # MCP sessions of tools served at a URL

    # -- what a family provides ----------------------------------------------------------------

    async def setup(self, task: Task, sandbox: Sandbox) -> None:
        """Build the task's initial state in the sandbox by running `setup_fn` there (if any).

        The sandbox is another process under another uid, so state is built from inside it.
        """
        if self.setup_fn is None:
            return
        fn_ref = f"{self.setup_fn.__module__}:{self.setup_fn.__name__}"
        result = await sandbox.call(fn_ref, {"setup": task.setup}, timeout_s=self.setup_timeout_s)
        if not result.ok:
            detail = f"{result.error_type}: {result.error}"
            raise SandboxError(f"{self.family}: building the task's state failed: {detail}")

    def human_reply(self, question: str) -> str:
        """What `ask_human` returns; automated runs have no human, and the call is counted."""
        return "No human is available. Continue on your own."

    async def host_call(
        self, call_id: str, tool: Tool, arguments: dict[str, Any], started: float
    ) -> CallOutcome:
        """A host tool's call (it runs here, not in the sandbox): a remote MCP server's tool, or
        `ask_human`, unless a family says otherwise."""
        if tool.remote is not None:
            if self._remote is None:
                self._remote = RemoteSessions()
            outcome = await self._remote.call(call_id, tool.name, tool.remote, arguments)
            if outcome.result.outcome is ToolOutcome.OK:
                cap = self.config.tool_output_chars
                content = outcome.result.content
                return CallOutcome.ok(call_id, tool.name, content, time.perf_counter() - started, cap)
            return CallOutcome(
                outcome.result.model_copy(update={"duration_s": time.perf_counter() - started})
            )
        if tool.permission == Permission.HUMAN:
            self.human_calls += 1
        content = self.human_reply(str(arguments.get("question", "")))
        return CallOutcome.ok(
            call_id, tool.name, content, time.perf_counter() - started, self.config.tool_output_chars
        )

    # -- the episode ---------------------------------------------------------------------------

    @classmethod
    def version(cls, config: EnvConfig | None = None) -> str:
        """Hash of the family's code, its tools' versions and its configuration."""
        return content_hash(
            {
                "family": cls.family,
                "code": code_fingerprint(*cls.__mro__),
                "tools": {t.name: t.version for t in cls.tools},
                "config": (config or EnvConfig()).as_json(),
            }
        )

    @property
    def final_answer(self) -> str | None:
        return self._answer

    async def close(self) -> None:
        remote, self._remote = self._remote, None
        if remote is not None:
            await remote.aclose()

    @property
    def task(self) -> Task:
        if self._task is None:
            raise RuntimeError("the episode has not started")
        return self._task

    async def start(self, task: Task, sandbox: Sandbox) -> Observation:
        if self._task is not None:
            raise RuntimeError("an Env instance serves one episode; make a new one")
        missing = [name for name in task.tools if name not in self.by_name]
        if missing:
            raise ValueError(f"task {task.id} needs tools this env lacks: {missing}")
        self._task, self._sandbox = task, sandbox
        await self.setup(task, sandbox)
        if self.config.noise.stale_p > 0:
            await sandbox.take_snapshot()
        offered = [self.by_name[n] for n in task.tools] if task.tools else list(self.tools)
        messages = task.prompt
        if self.system_prompt and not any(m.role == Role.SYSTEM for m in messages):
            messages = (Message(role=Role.SYSTEM, content=self.system_prompt), *messages)
        return Observation(messages=messages, tools=tuple(t.openai_schema() for t in offered))

    async def step(self, action: Action) -> StepResult:
        if action.is_final:
            self._answer = action.answer
            return StepResult((), (), done=True, termination=Termination.ANSWERED)
        results: list[ToolResult] = []
        for i, error in enumerate(action.parse_errors):
            results.append(
                ToolResult(call_id=f"parse.{i}", name="", outcome=ToolOutcome.PARSE_ERROR, error=error)
            )
        termination: Termination | None = None
        for call in action.tool_calls:
            outcome = await self._call(call.id, call.name, dict(call.arguments))
            results.append(outcome.result)
            termination = termination or outcome.terminates
            if termination is not None:
                break  # nothing runs after an unsafe action or a dead sandbox
        for result in results:
            self.counts[(result.name or "<unparsed>", result.outcome)] += 1
        invalid = all(r.outcome in _AGENT_ERRORS for r in results)
        self._invalid_streak = self._invalid_streak + 1 if invalid else 0
        if termination is None and self._invalid_streak >= self.config.max_invalid_actions:
            termination = Termination.INVALID_ACTION
        messages = tuple(_tool_message(r) for r in results)
        return StepResult(messages, tuple(results), done=termination is not None, termination=termination)

    async def _call(self, call_id: str, name: str, arguments: dict[str, Any]) -> CallOutcome:
        tool = self.by_name.get(name)
        if tool is None:
            known = ", ".join(sorted(self.by_name))
            return CallOutcome.error(
                call_id, name, ToolOutcome.UNKNOWN_TOOL, f"no tool {name!r}; tools: {known}"
            )
        if tool.permission not in self.config.allowed:
            detail = f"tool {name} needs '{tool.permission.value}' permission, not granted in this env"
            return CallOutcome.error(call_id, name, ToolOutcome.PERMISSION_DENIED, detail)
        problem = tool.argument_error(arguments)
        if problem is not None:
            return CallOutcome.error(call_id, name, ToolOutcome.BAD_ARGUMENTS, problem)
        started = time.perf_counter()
        injected = await self.noise.before_call(tool)
        if injected is not None:
            return CallOutcome.of(call_id, name, injected, time.perf_counter() - started)
        if tool.host:
            return await self.host_call(call_id, tool, arguments, started)
        assert self._sandbox is not None
        stale = self.noise.stale(tool)
        try:
            result = await self._sandbox.call(
                tool.fn_ref, tool.call_args(arguments), timeout_s=tool.timeout_s, use_snapshot=stale
            )
        except SandboxError as exc:  # the platform failed, not the agent or the tool
            detail = f"{type(exc).__name__}: {exc}"
            return CallOutcome.error(call_id, name, ToolOutcome.INFRA_ERROR, detail)
        outcome = classify_call(call_id, name, result, self.config.tool_output_chars)
        return self.noise.after_call(outcome, stale=stale)


_AGENT_ERRORS = frozenset(
    {
        ToolOutcome.PARSE_ERROR,
        ToolOutcome.UNKNOWN_TOOL,
        ToolOutcome.BAD_ARGUMENTS,
        ToolOutcome.PERMISSION_DENIED,
    }
)


def _tool_message(result: ToolResult) -> Message:
    if result.outcome in (ToolOutcome.OK, ToolOutcome.OUTPUT_TRUNCATED):
        content = result.content
        if result.outcome == ToolOutcome.OUTPUT_TRUNCATED:
            content += f"\n[output truncated: {result.original_chars} characters in full]"
    else:
        content = f"error ({result.outcome.value}): {result.error}"
    return Message(role=Role.TOOL, content=content, tool_call_id=result.call_id, name=result.name or None)
