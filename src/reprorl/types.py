"""The records of the RL loop: tasks, messages, tool calls, turns, trajectories and rewards.

Every record is a frozen pydantic model that refuses unknown fields and carries a
`schema_version`, so a stored record can always be read back by the code that knows its shape.
Nothing here imports torch: these records are what every layer above passes around.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from reprorl.errors import UserInputError
from reprorl.hashing import HASH_PREFIX, canonical_json, content_hash, sha256_hex

SCHEMA_VERSION = 1


class Record(BaseModel):
    """Base of every stored record: frozen, strict about keys, versioned."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: int = SCHEMA_VERSION

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Split(StrEnum):
    """Which part of the data a task belongs to; eval and holdout never feed training."""

    TRAIN = "train"
    EVAL = "eval"
    HOLDOUT = "holdout"


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Permission(StrEnum):
    """What a tool may touch; a run can refuse tools above a given scope."""

    READ = "read"
    WRITE = "write"
    NETWORK = "network"
    HUMAN = "human"


class Termination(StrEnum):
    """Why an episode ended; every trajectory has exactly one."""

    ANSWERED = "answered"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    MAX_WALL_TIME = "max_wall_time"
    TOOL_TIMEOUT = "tool_timeout"
    INVALID_ACTION = "invalid_action"
    SANDBOX_ERROR = "sandbox_error"
    INFRA_ERROR = "infra_error"
    UNSAFE_ACTION = "unsafe_action"
    AGENT_ERROR = "agent_error"  # the agent program behind the proxy raised or exited non-zero
    ENV_DONE = "env_done"  # an external env (an OpenEnv server) said the episode is over


class ScoreFailure(StrEnum):
    """Why a rollout has no reward, or a zero it earned by breaking the state its verifier reads."""

    AGENT_STATE = "agent_state"  # a link, FIFO or special file the agent left; reward 0, the agent's
    VERIFIER_TIMEOUT = "verifier_timeout"
    VERIFIER_CRASH = "verifier_crash"
    VERIFIER_ERROR = "verifier_error"
    JUDGE_ERROR = "judge_error"


class ToolOutcome(StrEnum):
    """The class of a tool call's result, attributed to one boundary (model, tool, sandbox, infra)."""

    OK = "ok"
    PARSE_ERROR = "parse_error"
    UNKNOWN_TOOL = "unknown_tool"
    BAD_ARGUMENTS = "bad_arguments"
    PERMISSION_DENIED = "permission_denied"
    TOOL_EXCEPTION = "tool_exception"
    TOOL_TIMEOUT = "tool_timeout"
    OUTPUT_TRUNCATED = "output_truncated"
    SANDBOX_ERROR = "sandbox_error"
    INFRA_ERROR = "infra_error"


class ToolCall(Record):
    """One call the model asked for; `arguments` is the parsed JSON object."""

    id: str
    name: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)


class Message(Record):
    """A chat message as the model's template renders it."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


class Task(Record):
    """One problem for the agent; `reference` is hidden from it and given only to verifiers."""

    id: str = Field(min_length=1)
    family: str = Field(min_length=1)
    prompt: tuple[Message, ...] = Field(min_length=1)
    tools: tuple[str, ...] = ()
    reference: JsonValue = None
    setup: JsonValue = Field(
        default=None, description="Initial environment state (rows, files) the env builds; not hidden."
    )
    difficulty: int = Field(default=0, ge=0, description="Generator's difficulty level; 0 = unrated.")
    split: Split = Split.TRAIN
    tags: tuple[str, ...] = ()
    reference_steps: int | None = Field(default=None, ge=0)

    @property
    def content_hash(self) -> str:
        """Hash of everything that defines the task; any change makes a new task version."""
        return content_hash(self.to_json_dict())


class TaskSet(Record):
    """Ordered tasks; the content hash of the tasks is the task set's version."""

    name: str = Field(min_length=1)
    tasks: tuple[Task, ...]

    @field_validator("tasks")
    @classmethod
    def _unique_ids(cls, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
        seen: set[str] = set()
        for task in tasks:
            if task.id in seen:
                raise ValueError(f"task id {task.id!r} appears twice; ids must be unique")
            seen.add(task.id)
        return tasks

    @property
    def version(self) -> str:
        """sha256 of the canonical JSONL; the name is a label, so renaming keeps the version."""
        return HASH_PREFIX + sha256_hex(self.to_jsonl())

    def to_jsonl(self) -> bytes:
        """One canonical JSON task per line: equal content gives identical bytes."""
        return "".join(canonical_json(t.to_json_dict()) + "\n" for t in self.tasks).encode("utf-8")

    @classmethod
    def from_jsonl(cls, name: str, data: bytes, *, source: str = "<tasks>") -> TaskSet:
        """Parse JSONL (or a JSON array) of tasks; errors name the line and the field."""
        text = data.decode("utf-8")
        stripped = text.lstrip()
        if stripped.startswith("["):
            try:
                items = [(i + 1, item) for i, item in enumerate(json.loads(text))]
            except ValueError as exc:
                raise UserInputError(f"{source}: not valid JSON: {exc}") from None
        else:
            items = []
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    try:
                        items.append((number, json.loads(line)))
                    except ValueError as exc:
                        raise UserInputError(f"{source}:{number}: not valid JSON: {exc}") from None
        tasks = []
        for number, item in items:
            try:
                tasks.append(Task.model_validate(item))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "task"
                raise UserInputError(f"{source}:{number}: {where}: {first['msg']}") from None
        try:
            return cls(name=name, tasks=tuple(tasks))
        except ValidationError as exc:
            raise UserInputError(f"{source}: {exc.errors()[0]['msg']}") from None

    def split(self, split: Split) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.split == split)


class SamplingParams(Record):
    """Everything that shapes a sample; recorded with it so it can be drawn again."""

    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 disables top-k filtering.")
    max_tokens: int = Field(default=256, gt=0)
    seed: int = 0


class ToolResult(Record):
    """What came back from one tool call, with its outcome class and the details of a failure."""

    call_id: str
    name: str
    outcome: ToolOutcome
    content: str = ""
    error: str | None = None
    duration_s: float = Field(default=0.0, ge=0.0)
    original_chars: int | None = Field(
        default=None, ge=0, description="Length before truncation, when the output was cut."
    )
    noise: str | None = Field(
        default=None,
        description="Injected noise that shaped this result (timeout, transient, stale, truncate).",
    )
    env_reward: float | None = Field(
        default=None, description="The reward an external env (an OpenEnv server) reported for this step."
    )
    env_done: bool | None = Field(
        default=None, description="Whether the external env said the episode is over after this step."
    )


def _real_logprobs(logprobs: tuple[float, ...]) -> tuple[float, ...]:
    if any(lp != lp or lp > 0.0 for lp in logprobs):
        raise ValueError("logprobs must be real numbers <= 0")
    return logprobs


def sample_key(rollout_id: str, turn: int, choice: int = 0) -> str:
    """The key one sampled row goes by, in its batch and in replay: `<rollout_id>/<turn>`, and
    `<rollout_id>/<turn>.<choice>` for the other choices of a request that asked for several."""
    return f"{rollout_id}/{turn}" + (f".{choice}" if choice else "")


def parse_sample_key(key: str) -> tuple[str, int, int]:
    """`sample_key`'s parts: the rollout id, the turn index and the choice."""
    rollout_id, _, row = key.rpartition("/")
    turn, _, choice = row.partition(".")
    return rollout_id, int(turn), int(choice or 0)


class Alternative(Record):
    """Another of the choices sampled for one turn (an agent's request with `n` > 1), which the
    episode did not continue with: kept so the batch it was sampled in replays, never trained on."""

    choice: int = Field(ge=0, description="Its place among the request's choices (0 is the first).")
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    text: str = ""
    seed: int
    batch: tuple[str, ...] = ()
    stop: str | None = None
    finish_reason: Literal["stop", "length", "tool_call"] = "stop"

    @field_validator("logprobs")
    @classmethod
    def _valid_logprobs(cls, logprobs: tuple[float, ...]) -> tuple[float, ...]:
        return _real_logprobs(logprobs)


class Turn(Record):
    """One model turn: the tokens as sampled (never re-rendered) and what the tools returned."""

    index: int = Field(ge=0)
    prompt_token_ids: tuple[int, ...] = Field(
        default=(),
        description="Tokens appended to the context before this turn's sample: the whole rendered prompt "
        "on turn 0, the rendered tool results and next generation prompt after that. The context of "
        "turn t is the concatenation, over turns up to t, of prompt_token_ids and (before t) token_ids, "
        "from the last turn with context_reset on.",
    )
    context_reset: bool = Field(
        default=False,
        description="This turn's prompt_token_ids are a whole context rendered afresh, not an extension of "
        "the earlier turns: an agent behind the proxy sent a history that departs from what it was told "
        "(edited, dropped or reordered messages, other tools). Turn 0 is always a whole context.",
    )
    diverged_at: int | None = Field(
        default=None,
        ge=0,
        description="With context_reset: the index of the first message of the agent's request that "
        "departs from the history it was told.",
    )
    token_ids: tuple[int, ...] = Field(default=(), description="The sampled tokens, exactly as drawn.")
    logprobs: tuple[float, ...] = Field(
        default=(), description="Behaviour logprob of each sampled token (temperature-scaled, unfiltered)."
    )
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()
    policy_version: str = Field(default="", description="The exact weights this turn was sampled from.")
    seed: int | None = Field(default=None, description="Seed of this turn's sampling generator.")
    batch: tuple[str, ...] = Field(
        default=(),
        description="Keys ('<rollout_id>/<turn>') of every row sampled in the same batch, in slot order; "
        "replay re-runs that batch as it was.",
    )
    reused: int = Field(
        default=0,
        ge=0,
        description="Positions of the context whose keys and values the sampler kept from the previous "
        "turn instead of recomputing them: this turn's bits depend on that turn's batch too, so replay "
        "re-runs it first.",
    )
    rerender_ok: bool | None = Field(
        default=None,
        description="Whether rendering the conversation afresh with the chat template gives exactly the "
        "context's tokens (the exact-prefix check); None when not checked.",
    )
    finish_reason: Literal["stop", "length", "tool_call", "error"] = "stop"
    stop: str | None = Field(
        default=None,
        description="The agent's stop string that ended this turn: token_ids end with the token that "
        "completed it, and what the sampler drew after that was not kept (the agent never saw it).",
    )
    choice: int = Field(
        default=0,
        ge=0,
        description="Which of the request's choices the episode continued with (an agent that asked "
        "for n > 1 and sent back another than the first); its key is `<rollout>/<index>.<choice>`.",
    )
    alternatives: tuple[Alternative, ...] = Field(
        default=(),
        description="The request's other choices, sampled and returned to the agent, not trained on.",
    )
    sample_s: float = Field(default=0.0, ge=0.0)
    tool_s: float = Field(default=0.0, ge=0.0)

    @field_validator("logprobs")
    @classmethod
    def _valid_logprobs(cls, logprobs: tuple[float, ...]) -> tuple[float, ...]:
        return _real_logprobs(logprobs)

    def sampled_rows(self) -> tuple[Turn | Alternative, ...]:
        """Every row sampled for this turn: the one the episode continued with, then the others."""
        return (self, *self.alternatives)

    def row(self, choice: int) -> Turn | Alternative | None:
        """The sampled row of one of the request's choices, if the record holds it."""
        return next((r for r in self.sampled_rows() if r.choice == choice), None)


class Reward(Record):
    """An outcome score, its named components, and the exact verifier that produced it."""

    total: float
    components: dict[str, float] = Field(default_factory=dict)
    verifier_version: str

    @property
    def success(self) -> bool:
        """Whether the task was done: its outcome reaches 1 (shaping terms in the total do not count)."""
        return outcome_success(self.total, self.components)


def outcome_success(total: float, components: Mapping[str, float]) -> bool:
    """Success from a reward: the `outcome` component where the verifier gives one, else the total."""
    return components.get("outcome", total) >= 1.0


class Trajectory(Record):
    """A complete rollout record: enough to query it, explain it and replay it."""

    run_id: str
    rollout_id: str
    group_id: str = ""
    split: Split
    task_id: str
    task_hash: str
    prompt_template_hash: str = ""
    env_version: str = ""
    tool_versions: dict[str, str] = Field(default_factory=dict)
    base_model_hash: str = ""
    adapter_version: str | None = None
    policy_version: str = ""
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    turns: tuple[Turn, ...] = ()
    reward: Reward | None = None
    process_rewards: tuple[float, ...] = ()
    termination: Termination
    error: str | None = Field(default=None, description="Details of an infra, sandbox or scoring failure.")
    score_failure: ScoreFailure | None = Field(
        default=None,
        description="Why the verifier or judge gave no reward (the rollout is excluded from training and "
        "from every figure), or `agent_state` when the agent broke what its verifier reads (reward 0).",
    )
    infra_retries: int = Field(default=0, ge=0, description="Infra failures retried before this record.")
    retried: bool = Field(
        default=False, description="An infra-failed attempt that was run again; never the agent's result."
    )
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0.0, description="From the run spec's price table.")
    wall_s: float = Field(default=0.0, ge=0.0)
    cpu_s: float = Field(
        default=0.0, ge=0.0, description="CPU seconds: this rollout's share of its sampling batches."
    )
    step: int = Field(default=0, ge=0, description="Training step (or eval point) the rollout belongs to.")
    member: int = Field(default=0, ge=0, description="Index of this rollout within its group.")
    sampler: dict[str, JsonValue] = Field(
        default_factory=dict, description="How it was sampled: kind, dtype, threads, model hash."
    )
    sandbox: dict[str, JsonValue] = Field(
        default_factory=dict, description="The episode's sandbox: limits, isolation achieved, restarts."
    )
    agent: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="The agent program that drove the episode through the proxy (empty for reprorl's own "
        "loop): its kind, reference and code hash, exit status, output tails, requests and divergences.",
    )
    env: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="An external env's identity as the episode met it (empty for reprorl's own envs): an "
        "OpenEnv server's package, version and schema hash, or a verifiers taskset and its task's hash.",
    )

    def tool_outcomes(self) -> list[ToolOutcome]:
        return [r.outcome for turn in self.turns for r in turn.tool_results]

    def context_ids(self, turn: int) -> tuple[int, ...]:
        """The exact token context turn `turn` was sampled from (token-in/token-out)."""
        ids: list[int] = []
        for t in self.turns[: turn + 1]:
            if t.context_reset:
                ids.clear()
            ids.extend(t.prompt_token_ids)
            if t.index < turn:
                ids.extend(t.token_ids)
        return tuple(ids)


# Terminations that leave a rollout unscored: the platform failed, not the agent.
NOT_SCORED = frozenset({Termination.INFRA_ERROR, Termination.SANDBOX_ERROR})


def exclusion(trajectory: Trajectory) -> str | None:
    """The one rule for what counts: None when the rollout enters the update and every step and eval
    figure, else the class that leaves it out (`retried`, `infra_error`, `sandbox_error`, a scoring
    failure's class, or `unscored` for a record from before scoring failures had one).

    Only failures of the platform, the verifier or the judge leave a rollout out; what the agent
    caused (a parse error, an unsafe action, a planted link) is scored, as 0 where it earned nothing.
    """
    if trajectory.retried:
        return "retried"
    if trajectory.termination in NOT_SCORED:
        return trajectory.termination.value
    if trajectory.reward is None:
        return trajectory.score_failure.value if trajectory.score_failure else "unscored"
    return None
