"""A verifiers v1 taskset's own rewards: each `@vf.reward` of its task a component, scored on the transcript.

The task is rebuilt from the data the reprorl task carries (`reference["data"]`, checked against
the taskset's own content hash `reference["hash"]`), the episode becomes a `vf.Trace` (the prompt,
each reply, each tool result), and the task's `score` runs as verifiers runs it offline. Each
reward is the component `vf/<name>`; the outcome is their weighted mean under the taskset's
weights. A reward that did not run, or raised, fails the scoring (never a 0).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

from reprorl.rewards.base import FinalState, Verifier
from reprorl.rewards.registered import register_verifier
from reprorl.types import Message, Role, Task
from reprorl.verifiers_v1 import load_taskset, task_of


@register_verifier("verifiers-taskset")
@dataclass(frozen=True)
class VerifiersRewards(Verifier):
    """The rewards a verifiers v1 taskset defines, run on the episode's transcript."""

    taskset: str  # module:Class of the `vf.Taskset`
    config: dict[str, Any] = field(default_factory=dict)  # its `TasksetConfig`, as JSON

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        reference = task.reference
        if not isinstance(reference, dict) or "data" not in reference:
            raise ValueError(f"task {task.id} carries no verifiers task data")
        taskset = load_taskset(self.taskset, self.config)
        vf_task = task_of(taskset, reference["data"])
        if vf_task.hash != reference.get("hash"):
            raise ValueError(
                f"task {task.id}: its verifiers data no longer hashes to {reference.get('hash')}"
            )
        trace = _trace(vf_task, state.transcript, state.env_state)
        asyncio.run(vf_task.score(trace))
        if trace.errors:
            raise RuntimeError(f"the taskset's scoring failed: {trace.errors[-1].model_dump()}")
        components: dict[str, float] = {}
        total = weights = 0.0
        for name, reward in sorted(trace.rewards.items()):
            if reward is None or not math.isfinite(reward.score):
                raise ValueError(f"reward {name!r} gave {reward!r}, not a finite score")
            components[f"vf/{name}"] = min(1.0, max(0.0, float(reward.score)))
            total += components[f"vf/{name}"] * reward.weight
            weights += reward.weight
        if not components:
            raise ValueError(f"the taskset {self.taskset} defines no rewards")
        components[self.name] = total / weights if weights > 0 else 0.0
        return components


def _trace(vf_task: Any, transcript: tuple[Message, ...], env_state: str | None) -> Any:
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.state import state_cls
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask
    from verifiers.v1.types import AssistantMessage, SystemMessage, ToolMessage, UserMessage

    kinds = {Role.SYSTEM: SystemMessage, Role.USER: UserMessage, Role.ASSISTANT: AssistantMessage}
    nodes = []
    for index, message in enumerate(transcript):
        if message.role is Role.TOOL:
            built: Any = ToolMessage(content=message.content, tool_call_id=message.tool_call_id or "")
        else:
            built = kinds[message.role](content=message.content)
        nodes.append(
            MessageNode(
                parent=index - 1 if index else None, message=built, sampled=message.role is Role.ASSISTANT
            )
        )
    state_type = state_cls(type(vf_task))
    return Trace(
        state=state_type.model_validate_json(env_state) if env_state else state_type(),
        task=TraceTask(type=type(vf_task).__name__, data=vf_task.data, key=vf_task.key, hash=vf_task.hash),
        agent=AgentInfo(config=vf.AgentConfig(model="reprorl-policy")),
        nodes=nodes,
    )
