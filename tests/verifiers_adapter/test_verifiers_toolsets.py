"""A verifiers v1 taskset's toolsets as the agent's tools, run in reprorl's sandbox: their schemas
from MCP's `tools/list`, the rollout's `State` kept across an episode's calls and read by the
rewards, a fresh state per episode, a raised tool error classified.

The taskset is docs/verifiers.md's toolset block, as written, saved as the module `ledger_taskset`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from vf_support import docs_family, episodes

from reprorl import render_call
from reprorl.types import Message, Task, ToolOutcome


@pytest.fixture
def family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with docs_family("class LedgerTaskset(", "ledger_taskset", tmp_path, monkeypatch) as made:
        yield made


def test_the_toolsets_tools_are_offered_with_their_mcp_schemas(family: Any) -> None:
    tools = {t.name: t for t in family.env.tools}
    assert sorted(tools) == ["ledger_add", "ledger_item"]
    assert tools["ledger_add"].parameters["properties"] == {"amount": {"title": "Amount", "type": "integer"}}
    assert tools["ledger_add"].parameters["required"] == ["amount"]
    assert "running total" in tools["ledger_add"].description
    assert family.tool_modules == ("ledger_taskset", "reprorl.envs.external.vf_toolsets")
    # The tools' versions are in the env's: a changed toolset is a changed env.
    assert len({t.version for t in tools.values()}) == 2


def test_the_state_lasts_the_episode_is_fresh_each_episode_and_the_reward_reads_it(family: Any) -> None:
    runs = episodes(family, family.oracle, 4)
    for t in runs:
        assert t.reward is not None, t.error
        # Had the state carried over from the episode before, the total would be off.
        assert t.reward.components["vf/summed"] == 1.0
        calls = [c for turn in t.turns for c in turn.tool_results]
        assert calls and all(c.outcome is ToolOutcome.OK for c in calls)
        items = [int(c.content) for c in calls if c.name == "ledger_item"]
        assert json.loads(t.env["state"])["total"] == sum(items)
        assert t.env["toolsets"] == ["ledger"]

    def off_by_one(task: Task, messages: Sequence[Message]) -> str:
        reply = family.oracle(task, messages)
        return reply if "ledger_add" not in reply else reply.replace('"amount": ', '"amount": 1 + ')

    for t in episodes(family, off_by_one, 2):
        assert t.reward is not None and t.reward.components["vf/summed"] == 0.0


def test_a_raising_tool_is_the_tools_error_and_the_episode_goes_on(family: Any) -> None:
    def out_of_range(task: Task, messages: Sequence[Message]) -> str:
        if not any(m.role == "tool" for m in messages):
            return render_call("ledger_item", {"index": 99})
        return "done"

    (t,) = episodes(family, out_of_range, 1)
    (result,) = t.turns[0].tool_results
    assert result.outcome is ToolOutcome.TOOL_EXCEPTION and "index out of range" in (result.error or "")
    assert t.reward is not None and t.reward.components["vf/summed"] == 0.0
