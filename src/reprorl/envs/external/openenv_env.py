"""An env family backed by an OpenEnv server: each episode one WebSocket session, each action one step.

The server's action schema (`/schema`) becomes one tool; a call to it is a `step` of the episode's
session, and its observation comes back as the tool's result (JSON), with the reward and `done`
the server reported kept on the record (`ToolResult.env_reward`, `env_done`). `reset` opens the
episode with the task's `setup` as its arguments (a seed, say), and its observation is appended to
the task's prompt. A `done` from the server ends the episode (`env_done`); the server's rewards are
what the family's verifier scores (`reported`). A step the server refuses as invalid is the agent's
`bad_arguments`; a server that cannot be reached, times out or dies is the platform's failure
(`ExternalEnvError`: the rollout is `infra_error` and is run again). The session is closed when
the episode ends, however it ends, so no half-open session holds the server's capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import replace
from typing import Any, ClassVar

from openenv.core.client_types import StepResult as OpenEnvStep
from openenv.core.generic_client import GenericEnvClient

from reprorl.actions import Action
from reprorl.envs.base import EnvConfig, Observation, StepResult, ToolEnv
from reprorl.envs.calls import CallOutcome
from reprorl.envs.external.openenv_server import ExternalEnvError, OpenEnvServer
from reprorl.envs.sandbox import Sandbox
from reprorl.envs.tool import Tool
from reprorl.hashing import code_fingerprint, content_hash
from reprorl.types import Message, Permission, Role, Task, Termination, ToolOutcome

INVALID_CODES = frozenset({"VALIDATION_ERROR", "INVALID_ACTION", "INVALID_MESSAGE"})


class _RefusedStep(Exception):
    """The server answered a step with an error of the agent's making (an invalid action)."""


class _Client(GenericEnvClient):
    """OpenEnv's own dictionary client, keeping the server's error code instead of only its text."""

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        await self._send(message)
        response = await self._receive()
        if response.get("type") == "error":
            data = response.get("data") or {}
            code, text = str(data.get("code", "UNKNOWN")), str(data.get("message", "unknown error"))
            if code in INVALID_CODES:
                raise _RefusedStep(f"{code}: {text}")
            raise ExternalEnvError(f"the server answered {code}: {text}")
        return dict(response)


class OpenEnvEnv(ToolEnv):
    """Subclassed per family by `openenv_env` (the server, the tool's name and the instruction)."""

    server: ClassVar[OpenEnvServer]
    tool_name: ClassVar[str] = "step"
    instruction: ClassVar[str] = ""

    def __init__(self, config: EnvConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        self._client: _Client | None = None
        self._rewards: list[float] = []
        self._done = False

    @classmethod
    def served_tools(cls) -> tuple[Tool, ...]:
        """The server's action as one tool (asks the server for its schema once)."""
        cached = cls.__dict__.get("_tools")
        if cached is None:
            cached = (_action_tool(cls.tool_name, cls.server, cls.instruction),)
            cls._tools = cached  # type: ignore[attr-defined]
        return tuple(cached)

    @classmethod
    def version(cls, config: EnvConfig | None = None) -> str:
        return content_hash(
            {
                "family": cls.family,
                "code": code_fingerprint(*cls.__mro__),
                "server": cls.server.version(),
                "tools": {t.name: t.version for t in cls.served_tools()},
                "config": (config or EnvConfig()).as_json(),
            }
        )

    @property
    def reported(self) -> dict[str, float] | None:
        return {
            "return": math.fsum(self._rewards),
            "last": self._rewards[-1] if self._rewards else 0.0,
            "steps": float(len(self._rewards)),
            "done": float(self._done),
        }

    def info(self) -> dict[str, Any]:
        identity = self.server.identity()
        return {
            "kind": "openenv",
            "server": self.server.spec.name,
            "package": identity["package"],
            "package_version": identity["package_version"],
            "url": identity["url"],
            "schema_hash": content_hash(identity["schema"]),
            "metadata": identity["metadata"],
            "server_version": self.server.version(),
            "server_starts": self.server.starts,
        }

    async def start(self, task: Task, sandbox: Sandbox) -> Observation:
        opened = await super().start(task, sandbox)
        base_url = self.server.base_url()
        spec = self.server.spec
        self._client = _Client(
            base_url, connect_timeout_s=spec.connect_timeout_s, message_timeout_s=spec.call_timeout_s
        )
        kwargs = dict(task.setup) if isinstance(task.setup, dict) else {}
        result = await self._call_server(self._client.reset(**kwargs))
        first = Message(role=Role.USER, content=f"Observation: {_observation_text(result)}")
        messages = (*opened.messages, first)
        return Observation(messages=messages, tools=opened.tools)

    async def host_call(
        self, call_id: str, tool: Tool, arguments: dict[str, Any], started: float
    ) -> CallOutcome:
        if self._client is None:
            raise ExternalEnvError("the episode's session is not open")
        if self._done:
            detail = "the env has ended the episode; no more steps"
            return CallOutcome.error(call_id, tool.name, ToolOutcome.BAD_ARGUMENTS, detail)
        try:
            result = await self._call_server(self._client.step(arguments))
        except _RefusedStep as refused:
            return CallOutcome.error(call_id, tool.name, ToolOutcome.BAD_ARGUMENTS, str(refused))
        reward = _reward(result.reward)
        self._rewards.append(reward)
        self._done = bool(result.done)
        outcome = CallOutcome.ok(
            call_id,
            tool.name,
            _observation_text(result),
            time.perf_counter() - started,
            self.config.tool_output_chars,
        )
        result_record = outcome.result.model_copy(update={"env_reward": reward, "env_done": self._done})
        return CallOutcome(result_record, None)

    async def step(self, action: Action) -> StepResult:
        result = await super().step(action)
        if self._done and not result.done:
            return replace(result, done=True, termination=Termination.ENV_DONE)
        return result

    async def close(self) -> None:
        await super().close()
        client, self._client = self._client, None
        if client is not None:
            # A server that is gone or stuck takes its end of the session with it.
            with contextlib.suppress(TimeoutError, OSError):
                await asyncio.wait_for(client.disconnect(), timeout=self.server.spec.connect_timeout_s)

    async def _call_server(self, call: Any) -> OpenEnvStep[dict[str, Any]]:
        try:
            async with asyncio.timeout(self.server.spec.call_timeout_s):
                result: OpenEnvStep[dict[str, Any]] = await call
                return result
        except (_RefusedStep, ExternalEnvError):
            raise
        except TimeoutError as exc:
            raise ExternalEnvError(
                f"OpenEnv server {self.server.spec.name!r} did not answer within "
                f"{self.server.spec.call_timeout_s:.0f} s"
            ) from exc
        except Exception as exc:  # a closed socket, a refused connection: the server is not there
            raise ExternalEnvError(
                f"OpenEnv server {self.server.spec.name!r}: {type(exc).__name__}: {exc}"
            ) from exc


def openenv_env(family: str, server: OpenEnvServer, *, tool: str, instruction: str) -> type[OpenEnvEnv]:
    """The env class of one OpenEnv-backed family (`instruction` describes its tool when the server's
    action schema has no description)."""
    attributes = {"family": family, "server": server, "tool_name": tool, "instruction": instruction}
    made: type[OpenEnvEnv] = type(f"OpenEnv_{family.replace('-', '_')}", (OpenEnvEnv,), attributes)
    made.tools = _LazyTools()  # type: ignore[assignment]  # asked of the server when first needed
    return made


class _LazyTools:
    """`tools` of an OpenEnv family's class: its server is asked for them when first needed."""

    def __get__(self, instance: object, owner: type[OpenEnvEnv]) -> tuple[Tool, ...]:
        return owner.served_tools()


def _action_tool(name: str, server: OpenEnvServer, instruction: str) -> Tool:
    schema = dict(server.action_schema())
    properties = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": [r for r in schema.get("required") or [] if r in properties],
        "additionalProperties": False,
    }
    if "$defs" in schema:
        parameters["$defs"] = schema["$defs"]
    description = str(schema.get("description") or instruction or f"One step of the {name} env.")
    return Tool(
        name=name,
        description=description,
        parameters=parameters,
        permission=Permission.WRITE,
        fn_ref=f"openenv:{server.spec.name or name}",
        timeout_s=server.spec.call_timeout_s,
        host=True,
        source_hash=server.version(),
    )


def _observation_text(result: OpenEnvStep[dict[str, Any]]) -> str:
    observation = result.observation if isinstance(result.observation, dict) else {}
    shown = {k: v for k, v in observation.items() if k not in ("metadata", "reward", "done")}
    return json.dumps(shown, ensure_ascii=False, sort_keys=True)


def _reward(value: Any) -> float:
    """The server's step reward as a number; a missing one is 0, a non-finite one is the server's fault."""
    if value is None:
        return 0.0
    if isinstance(value, bool):
        return float(value)
    try:
        reward = float(value)
    except (TypeError, ValueError) as exc:
        raise ExternalEnvError(f"the server reported a reward that is not a number: {value!r}") from exc
    if not math.isfinite(reward):
        raise ExternalEnvError(f"the server reported a non-finite reward: {value!r}")
    return reward
