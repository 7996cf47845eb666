"""The LLM judge's settings: where the model is served, the rubric it reads, and what it costs.

They live with the run spec because a judge can score training rollouts (`DataSpec.judge`); the
judge itself (requests, parsing, the cache) is `reprorl.evaluation.judge`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from reprorl.hashing import HASH_PREFIX, sha256_hex

DEFAULT_RUBRIC = """You are grading an AI agent's attempt at a task.

Task:
{task}

Transcript (the agent's turns and the tool results it saw):
{transcript}

Final answer:
{answer}

Score how well the final answer accomplishes the task, from 0 (wrong or missing) to 1 (fully correct).
Reply with only a JSON object: {"score": <a number from 0 to 1>, "rationale": "<one short sentence>"}"""


class JudgeConfig(BaseModel):
    """Where the judge model is served, what it is asked, and what its tokens cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(description="OpenAI-compatible API root, e.g. 'http://127.0.0.1:8000/v1'.")
    model: str = Field(min_length=1, description="Model name sent in each request.")
    rubric: str = Field(
        default=DEFAULT_RUBRIC,
        description="Prompt template; {task}, {transcript}, {answer} and {reference} (the task's "
        "reference answer, which the agent never sees) are replaced, other braces kept.",
    )
    max_tokens: int = Field(default=256, gt=0, description="Reply length limit per judgement.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 makes a judge as repeatable as it gets.")
    seed: int = Field(default=0, description="Sent to servers that honour a sampling seed.")
    timeout_s: float = Field(default=120.0, gt=0.0, description="Read timeout of one request.")
    retries: int = Field(default=3, ge=0, description="Retries after a timeout, a 429 or a 5xx.")
    api_key_env: str | None = Field(default=None, description="Environment variable holding the API key.")
    prompt_usd_per_mtok: float = Field(default=0.0, ge=0.0, description="USD per million prompt tokens.")
    completion_usd_per_mtok: float = Field(
        default=0.0, ge=0.0, description="USD per million completion tokens."
    )
    max_concurrency: int = Field(default=8, ge=1, description="Requests in flight at once in a batch.")


class JudgeReward(JudgeConfig):
    """A judge whose score joins each training rollout's reward as the component `judge`."""

    override: str | None = Field(
        default=None,
        description="Why to train on this judge although its robustness audit refused it or never ran; "
        "recorded on the run as a judge_override event.",
    )


def judge_id(config: JudgeConfig) -> str:
    """'<model>@<first 12 hex of the rubric's hash>': one rubric of one model, as scores name it."""
    return f"{config.model}@{rubric_hash(config).removeprefix(HASH_PREFIX)[:12]}"


def rubric_hash(config: JudgeConfig) -> str:
    return HASH_PREFIX + sha256_hex(config.rubric.encode("utf-8"))
