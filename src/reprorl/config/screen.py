"""Screening settings: which task set, which policy, how many attempts — pinned, so a screen can be re-run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from reprorl.config.base import SpecModel
from reprorl.hashing import content_hash
from reprorl.types import Split


class ScreenSpec(SpecModel):
    """One screening of a task set by a policy; its hash is the screen record's spec hash."""

    taskset: str = Field(description="The task set screened, pinned (`name@sha256:…`).")
    split: Split | None = Field(default=None, description="Screen only this split; none = every task.")
    policy: str = Field(
        description="`oracle` (each family's scripted solution: finds broken tasks), or the base model "
        "pinned, with `+` and a pinned adapter when the policy has one."
    )
    k: int = Field(default=8, ge=1, description="Attempts per task; the pass rate p is out of these.")
    seed: int = Field(default=0, description="Root of every attempt's seed (and so of its sampling).")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: int = Field(default=64, ge=1, description="Max new tokens per model turn.")
    max_turns: int = Field(default=3, ge=1, description="Max model turns per episode.")
    sampling_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="Precision the local sampler runs in."
    )
    chunk: int = Field(
        default=8, ge=1, description="Tasks per recorded part: what a killed screen loses at most."
    )
    replays: int = Field(
        default=1,
        ge=0,
        description="Times one attempt per task is replayed action for action and re-scored; a task "
        "whose verifier gives a replay another outcome is `flaky`.",
    )
    probes: bool = Field(
        default=True,
        description="Run every exploit probe on each task; a probe that scores makes it `suspect`.",
    )
    concurrency: int = Field(default=16, ge=1, description="Episodes run at once.")

    def spec_hash(self) -> str:
        return content_hash(self.record_spec())

    def record_spec(self) -> dict[str, object]:
        """What the screen's record stores as its spec."""
        return {"screen": self.model_dump(mode="json")}


class SignalScreen(SpecModel):
    """In-loop screening (`data.screen`): each step draws from the train tasks still showing a
    trainable signal (see `reprorl.orchestrate.run.signal_pool`)."""

    rest_steps: int = Field(
        default=8,
        ge=1,
        description="Steps a task sits out after a group of it taught nothing (every member passed, or "
        "all rewards were equal): by then the policy has moved and it may teach again.",
    )
