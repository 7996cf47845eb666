"""The data decision of a run spec: the tasks practised on, their tools' noise, and how they are scored."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from reprorl.config.base import Owner, SpecModel
from reprorl.config.judge import JudgeTable
from reprorl.config.screen import SignalScreen
from reprorl.refs import ArtifactRef


class NoiseSpec(SpecModel):
    """Tool noise injected on purpose, seeded per episode, part of the environment's version."""

    latency_s: float = Field(default=0.0, ge=0.0, le=60.0, description="Added latency per tool call.")
    latency_sigma: float = Field(
        default=0.0,
        ge=0.0,
        le=4.0,
        description="Lognormal spread of the added latency: latency_s * exp(sigma * z), z ~ N(0, 1), "
        "a heavy tail; 0 = fixed.",
    )
    jitter_s: float = Field(default=0.0, ge=0.0, le=60.0, description="Uniform extra latency, 0..jitter.")
    timeout_p: float = Field(default=0.0, ge=0.0, le=1.0, description="Chance a call times out.")
    transient_error_p: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Chance a call fails with a retryable infra error."
    )
    stale_p: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Chance a read-only call sees the episode's start state."
    )
    truncate_p: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Chance a call's output is cut short (and flagged)."
    )

    @property
    def active(self) -> bool:
        return any(v > 0 for v in self.model_dump().values())


LATER_DATA_FIELDS = ("family_weights", "screen")


def check_reward_weights(weights: dict[str, float]) -> None:
    """Refuse weights that cannot mean what they say (ValueError, naming the fix)."""
    if any(not math.isfinite(w) for w in weights.values()):
        raise ValueError("reward_weights must be finite numbers, e.g. { outcome = 1.0 }")
    if weights.get("failed_calls", 0.0) > 0:
        raise ValueError(
            "reward_weights.failed_calls counts failing calls: a weight above 0 pays for them; "
            "give it a weight below 0, e.g. failed_calls = -0.1"
        )


class DataSpec(SpecModel):
    """What the agent practises on; each task names its family, whose env version every rollout records."""

    owner: Owner
    train: ArtifactRef = Field(description="Training task set, e.g. 'calc-train@v2'.")
    tool_output_chars: int = Field(
        default=4096, gt=0, description="Tool output longer than this is truncated and flagged."
    )
    noise: NoiseSpec = Field(default_factory=NoiseSpec, description="Tool noise injection.")
    family_weights: dict[str, float] | None = Field(
        default=None,
        description="How each step's tasks are shared among the env families of data.train, as "
        "weights (normalised): every step draws each family's quota of tasks_per_step (largest "
        "remainder), so a mixed-family run trains on every weighted family at every step. A family "
        "of weight 0 is not drawn. None: one draw from the whole set, whatever its families.",
    )
    screen: SignalScreen | None = Field(
        default=None,
        description="In-loop screening, e.g. { rest_steps = 8 }: a task whose group taught nothing rests "
        "that many steps and each step draws from the others (seed 004's trainable signal); the tasks "
        "that last showed signal are registered as `<train>-signal`. None: every task is drawn alike.",
    )
    reward_weights: dict[str, float] = Field(
        default_factory=lambda: {"outcome": 1.0},
        description="Weight of each reward component in the total; unlisted components count 0. "
        "Components: the verifier's ('outcome'), 'judge', 'valid_calls' (share of well-formed calls, "
        "1.0 with no call), 'permission_respected', and 'failed_calls' (calls the agent got wrong, a "
        "count: weigh it below 0, e.g. failed_calls = -0.1, so a retry after a failing call earns "
        "less than a call right the first time). Check shaping with `reprorl rewards audit --weight`: "
        "a weight that pays an episode with no work (valid_calls > 0 does) fails it.",
    )
    verifier_timeout_s: float = Field(
        default=30.0,
        gt=0.0,
        le=3600.0,
        description="Time one verifier call may take; past it the rollout is unscored (verifier_timeout) "
        "and left out of training, unless the agent's final state caused it.",
    )
    max_invalid_actions: int = Field(
        default=3, ge=1, description="Consecutive unparsable or invalid actions that end an episode."
    )
    tool_permissions: tuple[Literal["read", "write", "network", "human"], ...] = Field(
        default=("read", "write", "human"),
        description="Permission scopes tools may use; a call to a tool outside them is denied.",
    )
    judge: JudgeTable | None = Field(
        default=None,
        description="An LLM judge scoring every rollout, a table chosen by `kind` (see the judge tables "
        "below); its score is the reward component 'judge', weighed by reward_weights. A judge its "
        "robustness audit refused (or never audited) is refused.",
    )

    @model_serializer(mode="wrap")
    def _later_fields_left_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Fields added after the first release are left out of every dump while unset, so the spec
        # documents (and hashes) of earlier runs read the same as before they existed.
        data: dict[str, Any] = handler(self)
        for name in LATER_DATA_FIELDS:
            if data.get(name, ...) is None:
                del data[name]
        return data

    @model_validator(mode="after")
    def _family_weights_are_shares(self) -> DataSpec:
        weights = self.family_weights
        if weights is not None:
            if any(not math.isfinite(w) or w < 0 for w in weights.values()):
                raise ValueError("family_weights must be finite and >= 0, e.g. { calculator = 1, sql = 2 }")
            if not any(w > 0 for w in weights.values()):
                raise ValueError("family_weights gives no family a weight above 0; give one, or remove it")
        return self

    @model_validator(mode="after")
    def _penalties_are_penalties(self) -> DataSpec:
        check_reward_weights(self.reward_weights)
        return self

    @model_validator(mode="after")
    def _judge_is_weighed(self) -> DataSpec:
        if self.judge is not None and not self.reward_weights.get("judge"):
            raise ValueError("data.judge is set but reward_weights gives 'judge' no weight; add judge = 1.0")
        return self
