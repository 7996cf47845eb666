"""Training through the agent proxy: three real agent frameworks, the tiny model, `reprorl run` and `replay`.

Each client trains two steps; the record shows the weights moved, every reply the agent was told
is the policy's recorded tokens, and `reprorl replay` runs the agent again and reproduces them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import Cli, run_ids, tiny_spec, tiny_training_store

from reprorl.openai_api.openai_format import structured
from reprorl.store import find_run
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Termination, Trajectory

AGENTS = str(Path(__file__).resolve().parents[1] / "agents")
EVAL_TASKS = 4  # a small frozen suite: the subject is the proxy, not the estimate


def told(trajectory: Trajectory) -> list[str]:
    """Each reply's content as the agent received it, rebuilt from the recorded tokens' text."""
    return [
        structured(t.text, t.finish_reason, None, tools=True, seed=t.seed or 0, choice=0).content or ""
        for t in trajectory.turns
    ]


def what_the_agent_saw(client: str, trajectory: Trajectory) -> list[str]:
    """What the agent itself reported of the replies (its return value, recorded by the launcher)."""
    returned: Any = trajectory.agent["returned"]
    if client.startswith("openai_loop:"):
        return [step["content"] or "" for step in json.loads(returned)]
    return [*told(trajectory)[:-1], returned]  # the frameworks return their final output


# `picky` is the plain `openai` loop asking for n=2 under a stop string and going on from the second
# choice; its rewards happen not to vary on the tiny model, so its groups give no gradient.
@pytest.mark.parametrize(
    "client", ["openai_loop:agent", "agents_sdk:agent", "langgraph_agent:agent", "openai_loop:picky"]
)
def test_an_agent_framework_trains_through_the_proxy_and_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], client: str
) -> None:
    store = tiny_training_store(tmp_path)
    small = tmp_path / "calc-eval-small.jsonl"
    small.write_bytes(b"".join(store.read("calc-eval@v1").splitlines(keepends=True)[:EVAL_TASKS]))
    store.add("calc-eval-small", small, kind="taskset")
    spec = tiny_spec("agent-train", evaluation={"suites": ["calc-eval-small"]}) + (
        f'[agent]\nowner = "t@x"\ncallable = "{client}"\npath = [{json.dumps(AGENTS)}]\n'
    )
    (tmp_path / "spec.toml").write_text(spec)
    cli = Cli(tmp_path / "home", capsys)
    code, _, err = cli("run", str(tmp_path / "spec.toml"))
    assert code == 0, err
    (run_id,) = run_ids(tmp_path / "home")
    record = find_run(store, run_id)
    metrics = record.metrics().records
    steps = [m for m in metrics if m.get("stage") is None]
    evals = [m for m in metrics if m.get("stage") == "eval"]
    assert [m["step"] for m in steps] == [0, 1]
    if client != "openai_loop:picky":  # the rollouts the agent drove were trained on: the weights moved
        assert any(m["train/grad_norm"] > 0 for m in steps)
        assert steps[0]["policy_version"] != evals[-1]["policy_version"]

    rollouts = list(RolloutStore(record).trajectories())
    assert len(rollouts) == 8 + 2 * EVAL_TASKS
    for t in rollouts:
        assert t.agent["kind"] == "callable" and t.agent["ref"] == client, t.agent
        assert t.termination in {Termination.ANSWERED, Termination.MAX_TURNS, Termination.MAX_TOKENS}, t.error
        assert t.turns and all(turn.token_ids and turn.seed is not None for turn in t.turns)
        if t.termination is Termination.ANSWERED:
            # What the agent was told is exactly what the policy sampled, as recorded.
            assert what_the_agent_saw(client, t) == told(t), t.rollout_id

    if client == "openai_loop:picky":
        firsts = [t.turns[0] for t in rollouts]
        assert all(f.choice == 1 and [a.choice for a in f.alternatives] == [0] for f in firsts)
        assert any(turn.stop == "7" for t in rollouts for turn in t.turns)

    # `reprorl replay` runs the agent again through a proxy of its own and draws the same tokens.
    chosen = [next(t.rollout_id for t in rollouts if f"/train/{step}/" in t.rollout_id) for step in (0, 1)]
    for mode in ("live", "recorded"):
        code, out, err = cli("replay", *chosen, "--mode", mode, "--json")
        assert code == 0, (out, err)
        reports = json.loads(out)
        reports = reports if isinstance(reports, list) else [reports]
        assert [r["identical"] for r in reports] == [True, True] and all(r["mode"] == mode for r in reports)
