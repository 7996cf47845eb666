"""Trajectories built in code for the rollout-store tests: one of each failure shape, realistic fields."""

from __future__ import annotations

import hashlib
import random

from reprorl.evaluation.judge import JudgeScore
from reprorl.types import (
    Reward,
    SamplingParams,
    Split,
    Termination,
    ToolCall,
    ToolOutcome,
    ToolResult,
    Trajectory,
    Turn,
)

RUN = "20250101T000000000000Z-abc123"
KINDS = ("answered", "tool_timeout", "recovered", "infra_error", "parse_error", "truncated")


def turn(index: int, seed: int, *results: ToolResult, finish: str = "tool_call") -> Turn:
    rng = random.Random(seed * 100 + index)
    tokens = tuple(rng.randrange(50_000) for _ in range(24))
    calls = tuple(ToolCall(id=r.call_id, name=r.name, arguments={"expr": "2+2"}) for r in results)
    return Turn(
        index=index,
        prompt_token_ids=tuple(rng.randrange(50_000) for _ in range(16)),
        token_ids=tokens,
        logprobs=tuple(-rng.random() * 5 for _ in tokens),
        text=f"turn {index}: größer als ∑ — <tool_call>…",
        tool_calls=calls,
        tool_results=results,
        policy_version="adapter@step-3",
        finish_reason=finish,  # type: ignore[arg-type]
        sample_s=0.25,
        tool_s=0.5,
    )


def result(name: str, outcome: ToolOutcome, **kwargs: object) -> ToolResult:
    return ToolResult(call_id=f"{name}-{outcome.value}", name=name, outcome=outcome, **kwargs)  # type: ignore[arg-type]


def make(i: int, kind: str, run_id: str = RUN) -> Trajectory:
    """One trajectory of each failure shape, with realistic fields."""
    ok = result("calculator", ToolOutcome.OK, content="4", duration_s=0.01)
    timeout = result("sql", ToolOutcome.TOOL_TIMEOUT, error="no reply within 2.0 s", duration_s=2.0)
    turns: tuple[Turn, ...]
    reward: Reward | None = Reward(
        total=0.0, components={"outcome": 0.0, "format": 0.5}, verifier_version="sha256:" + "v" * 8
    )
    termination, error, retries = Termination.ANSWERED, None, 0
    if kind == "answered":
        turns = (turn(0, i, ok), turn(1, i, finish="stop"))
        reward = Reward(total=1.0, components={"outcome": 1.0, "format": 1.0}, verifier_version="sha256:v1")
    elif kind == "tool_timeout":
        turns = (turn(0, i, ok), turn(1, i, timeout))
        termination = Termination.TOOL_TIMEOUT
    elif kind == "recovered":  # a tool timed out, the agent still answered correctly
        turns = (turn(0, i, timeout), turn(1, i, ok), turn(2, i, finish="stop"))
        reward = Reward(total=1.0, components={"outcome": 1.0}, verifier_version="sha256:v1")
    elif kind == "infra_error":
        turns, reward, termination = (), None, Termination.INFRA_ERROR
        error, retries = "ConnectionError: policy server unreachable", 2
    elif kind == "parse_error":
        turns = (turn(0, i, result("?", ToolOutcome.PARSE_ERROR, error="invalid JSON at char 7")),)
        termination = Termination.INVALID_ACTION
    elif kind == "truncated":
        big = result("files", ToolOutcome.OUTPUT_TRUNCATED, content="x" * 100, original_chars=100_000)
        turns = (turn(0, i, big), turn(1, i, finish="length"))
        termination = Termination.MAX_TOKENS
    else:
        raise AssertionError(kind)
    return Trajectory(
        run_id=run_id,
        rollout_id=f"{run_id}/r{i:04d}",
        group_id=f"g{i // 4}",
        split=Split.EVAL if i % 5 == 0 else Split.TRAIN,
        task_id=f"calc-{i % 7}",
        task_hash="sha256:" + hashlib.sha256(str(i % 7).encode()).hexdigest(),
        prompt_template_hash="sha256:tmpl",
        env_version="sha256:env",
        tool_versions={"calculator": "sha256:c1", "sql": "sha256:s1"},
        base_model_hash="sha256:smollm2",
        adapter_version=None if i % 2 else "sha256:adapter",
        policy_version="adapter@step-3",
        sampling=SamplingParams(temperature=0.7, top_p=0.95, top_k=0, max_tokens=256, seed=2**62 + i),
        turns=turns,
        reward=reward,
        process_rewards=(0.1, 0.2)[: len(turns)],
        termination=termination,
        error=error,
        infra_retries=retries,
        prompt_tokens=100 * len(turns),
        completion_tokens=24 * len(turns),
        cost_usd=0.0001 * len(turns),
        wall_s=1.5 + i,
        sandbox={"isolation": "unshare", "limits": {"cpu_s": 10}},
    )


def batch(step: int, n: int = 6, run_id: str = RUN) -> list[Trajectory]:
    return [make(step * 100 + j, KINDS[j % len(KINDS)], run_id) for j in range(n)]


def judge_score(
    run_id: str, rollout_id: str, score: float, *, judge: str = "judge-model@abc", n: int = 0
) -> JudgeScore:
    """A stored judge verdict on one rollout, as `reprorl rewards judge` writes it."""
    return JudgeScore(
        run_id=run_id,
        rollout_id=rollout_id,
        judge=judge,
        judge_model=judge.split("@", 1)[0],
        prompt_hash="sha256:abc",
        request_hash=f"sha256:{n}",
        score=score,
        time="2025-01-01T00:00:00+00:00",
    )
