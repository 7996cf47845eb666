"""Agent programs behind the proxy: real agent frameworks run episodes whose every turn is in the record.

The sampler here is scripted in the model's own tokens (turn 0 calls the calculator with the
task's expression, later turns answer with the reference), so each framework's handling of a real
tool call is exercised and the verifier can pass; the subject is the proxy, the launch in the
sandbox and the record. Training through the proxy with the real tiny model is in
`test_agent_training.py`.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from reprorl.actions import render_call
from reprorl.config import AgentSpec
from reprorl.policy import LoadedModel, tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sample, SampleRequest
from reprorl.rollout import FAMILIES
from reprorl.rollout.agents import resolve_program
from reprorl.rollout.episode import EpisodeLimits, Provenance
from reprorl.rollout.runner import RolloutRunner, plan_groups
from reprorl.trainer import sequences
from reprorl.types import SamplingParams, Split, Task, Termination, ToolOutcome, Trajectory

AGENTS = str(Path(__file__).resolve().parents[1] / "agents")


class Oracle:
    """Turn 0 calls `calc` on the task's expression; every later turn answers with the reference."""

    policy_version = "scripted:oracle"

    def __init__(self, model: LoadedModel, tasks: Sequence[Task], *, call_every_turn: bool = False) -> None:
        self.tokenizer = model.tokenizer
        self.eos = int(model.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.tasks = {t.id: t for t in tasks}
        self.call_every_turn = call_every_turn
        self.samples: dict[str, Sample] = {}
        self.lock = threading.Lock()

    def info(self) -> dict[str, Any]:
        return {"kind": "scripted"}

    def sample(self, requests: Sequence[SampleRequest]) -> list[Sample]:
        out = []
        for r in requests:
            rollout, _, turn = r.key.rpartition("/")
            task = self.tasks[rollout.split("/")[-2]]
            reference: Any = task.reference
            if int(turn) == 0 or self.call_every_turn:
                text = render_call("calc", {"expression": reference["expression"]})
            else:
                text = str(reference["answer"])
            ids = (*self.tokenizer.encode(text, add_special_tokens=False), self.eos)
            sample = Sample(
                key=r.key,
                token_ids=tuple(ids),
                logprobs=tuple(-0.25 for _ in ids),
                finish_reason="stop",
                text=text,
                batch=tuple(q.key for q in requests),
                policy_version=self.policy_version,
            )
            with self.lock:
                self.samples[r.key] = sample
            out.append(sample)
        return out


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model(0)


def _tasks(n: int) -> list[Task]:
    return list(FAMILIES["calculator"].generate(3, train=n, eval=0, holdout=0)[Split.TRAIN].tasks)


async def _episodes(
    model: LoadedModel,
    agent: dict[str, Any],
    *,
    tasks: int = 2,
    group: int = 2,
    limits: EpisodeLimits | None = None,
    **oracle: Any,
) -> tuple[list[Trajectory], Oracle]:
    renderer = ChatRenderer(model.tokenizer)
    chosen = _tasks(tasks)
    sampler = Oracle(model, chosen, **oracle)
    program = resolve_program(AgentSpec(owner="t@x", path=(AGENTS,), **agent))
    async with RolloutRunner(
        sampler,  # type: ignore[arg-type]
        renderer,
        run_id="r",
        params=SamplingParams(max_tokens=64),
        provenance=Provenance("sha256:base", None, renderer.template_hash, sampler.info()),
        limits=limits or EpisodeLimits(max_turns=4, wall_s=120),
        agent=program,
    ) as runner:
        result = await runner.run(plan_groups(chosen, group, run_id="r", run_seed=5, step=0))
    return result.trajectories, sampler


def _run(model: LoadedModel, agent: dict[str, Any], **kw: Any) -> tuple[list[Trajectory], Oracle]:
    return asyncio.run(_episodes(model, agent, **kw))


def _assert_recorded_as_sampled(trajectories: Sequence[Trajectory], sampler: Oracle) -> None:
    for t in trajectories:
        for turn in t.turns:
            sample = sampler.samples[f"{t.rollout_id}/{turn.index}"]
            assert turn.token_ids == sample.token_ids and turn.logprobs == sample.logprobs
            assert turn.batch == sample.batch and turn.policy_version == sampler.policy_version


FRAMEWORKS = {
    "openai-sdk": {"callable": "openai_loop:agent"},
    "agents-sdk-chat": {"callable": "agents_sdk:agent"},
    "agents-sdk-responses": {"callable": "agents_sdk:responses_agent"},
    "langgraph": {"callable": "langgraph_agent:agent"},
    # A program of its own, standard library only, under the system's interpreter and under reprorl's.
    "command": {"command": ["/usr/bin/python3", f"{AGENTS}/command_agent.py"]},
    "command-python": {"command": ["{python}", f"{AGENTS}/command_agent.py"]},
}


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_framework_runs_a_tool_call_episode_recorded_token_for_token(
    model: LoadedModel, framework: str
) -> None:
    trajectories, sampler = _run(model, FRAMEWORKS[framework])
    assert len(trajectories) == 4
    for t in trajectories:
        assert t.termination is Termination.ANSWERED, (t.error, t.agent)
        assert len(t.turns) == 2
        call, answer = t.turns
        # The framework ran its own tool on the call the policy made; its result is on the turn.
        assert call.finish_reason == "tool_call" and [c.name for c in call.tool_calls] == ["calc"]
        assert [r.outcome for r in call.tool_results] == [ToolOutcome.OK]
        task_answer = str(sampler.tasks[t.task_id].reference["answer"])  # type: ignore[index]
        assert call.tool_results[0].content == task_answer
        assert answer.context_reset is False and answer.finish_reason == "stop"
        # The verifier scored the agent's last reply: the reference, so the outcome is 1.
        assert t.reward is not None and t.reward.components["outcome"] == 1.0
        assert t.agent["code_hash"].startswith("sha256:") and t.agent["requests"] == 2
        assert t.agent["divergences"] == 0
        # The second turn's context continues the first token for token: never re-rendered.
        assert t.context_ids(1)[: len(t.context_ids(0))] == t.context_ids(0)
        assert len(sequences(t)) == 1
    _assert_recorded_as_sampled(trajectories, sampler)


def test_an_edited_history_is_recorded_as_diverged(model: LoadedModel) -> None:
    trajectories, sampler = _run(model, {"callable": "editing:agent"}, tasks=1, group=1)
    (t,) = trajectories
    assert t.termination is Termination.ANSWERED, t.error
    first, second = t.turns
    assert not first.context_reset
    # The agent replaced the model's reply (message 2, after system and user) with its own note.
    assert second.context_reset and second.diverged_at == 2
    assert t.agent["divergences"] == 1
    rendered = ChatRenderer(model.tokenizer).decode(second.prompt_token_ids)
    assert "(earlier answer elided)" in rendered and rendered.startswith("<|im_start|>system")
    # Each turn is trained in the context it was sampled in: two sequences, not one spliced.
    parts = sequences(t, advantage=1.0)
    assert [sum(p.mask) for p in parts] == [len(first.token_ids), len(second.token_ids)]
    assert t.context_ids(1) == second.prompt_token_ids
    _assert_recorded_as_sampled(trajectories, sampler)


def test_an_agent_that_never_stops_is_cut_at_the_turn_limit(model: LoadedModel) -> None:
    trajectories, _ = _run(
        model,
        {"callable": "openai_loop:agent"},
        tasks=1,
        group=1,
        call_every_turn=True,
        limits=EpisodeLimits(max_turns=3, wall_s=120),
    )
    (t,) = trajectories
    assert t.termination is Termination.MAX_TURNS
    assert len(t.turns) == 3 and t.reward is not None and t.reward.components["outcome"] == 0.0


def test_an_agent_that_raises_is_the_agents_failure_and_scored(model: LoadedModel) -> None:
    trajectories, _ = _run(model, {"callable": "broken_agent:agent"}, tasks=1, group=1)
    (t,) = trajectories
    assert t.termination is Termination.AGENT_ERROR
    assert "RuntimeError: the agent gave up" in (t.error or "")
    assert "gave up" in t.agent["traceback"]  # type: ignore[operator]
    assert t.reward is not None and t.reward.total == 0.0 and t.score_failure is None


def test_an_agent_past_its_wall_clock_is_killed_with_what_it_started(model: LoadedModel) -> None:
    trajectories, _ = _run(
        model, {"callable": "broken_agent:sleeper"}, tasks=1, group=1, limits=EpisodeLimits(wall_s=2.0)
    )
    (t,) = trajectories
    assert t.termination is Termination.MAX_WALL_TIME and t.wall_s < 30
    assert t.sandbox["isolation"]["network"] == "none"  # it shares the host's loopback with the proxy


def test_a_missing_agent_module_is_one_line_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"agent\.callable: no module 'no_such_agent'"):
        resolve_program(AgentSpec(owner="t@x", callable="no_such_agent:agent", path=(AGENTS,)))
    with pytest.raises(ValueError, match=r"exactly one of agent\.callable"):
        AgentSpec(owner="t@x")


def test_the_agents_code_is_hashed(tmp_path: Path) -> None:
    hashes = []
    for letter in "ab":
        (tmp_path / "mine.py").write_text(f"def agent(**kw): return {letter!r}\n")
        program = resolve_program(AgentSpec(owner="t@x", callable="mine:agent", path=(str(tmp_path),)))
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", program.code_hash)
        hashes.append(program.code_hash)
    assert hashes[0] != hashes[1]
    assert json.loads(json.dumps(program.info()))["ref"] == "mine:agent"
