"""The checklist judge: the weighted share of written criteria that the judge model says a rollout meets.

A single score from 0 to 1 from a rubric hides which part of the task the judge credited. A checklist
("rubrics as rewards") asks one question per criterion — did the answer name the table, did it
leave the other rows alone — and the score is Σ wᵢ·metᵢ / Σ wᵢ, so two rollouts with the same
score can be told apart in the record, and a criterion can be weighed by how much it matters. All
criteria go in one request; a reply that does not answer each of them, in order, is a parse error,
never a partial score.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reprorl.config.judge import ATTEMPT, JudgeConfig
from reprorl.evaluation.judge import Judge, register_judge
from reprorl.evaluation.verdict import Verdict, last_json_object, rationale_of, short
from reprorl.types import Task, Trajectory

CHECKLIST_RUBRIC = (
    """You are checking an AI agent's attempt at a task against a list of criteria.

"""
    + ATTEMPT
    + """

Criteria:
{criteria}

For each criterion, in order, decide whether the agent's attempt meets it.
Reply with only a JSON object, one true or false per criterion, in order:
{"met": [true, false, ...], "rationale": "<one short sentence>"}"""
)


class Criterion(BaseModel):
    """One thing the attempt should do, and how much it counts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = Field(min_length=1, pattern=r"\S", description="The criterion as the judge reads it.")
    weight: float = Field(default=1.0, gt=0.0, description="Its share of the score, relative to the others.")


class ChecklistConfig(JudgeConfig):
    """`kind = "checklist"`: the weighted share of `criteria` met, in one request per rollout."""

    kind: Literal["checklist"] = "checklist"
    rubric: str = Field(
        default=CHECKLIST_RUBRIC,
        description="Prompt template; {criteria} (the numbered list), {task}, {transcript}, {answer} and "
        "{reference} are replaced, other braces kept.",
    )
    criteria: tuple[Criterion, ...] = Field(
        max_length=64,
        description="The criteria, each `{ text = '...', weight = 1.0 }`; the reply says of each, in "
        "order, whether it is met.",
    )

    @field_validator("rubric")
    @classmethod
    def _shows_criteria(cls, rubric: str) -> str:
        if "{criteria}" not in rubric:
            raise ValueError("a checklist template must show the criteria; include {criteria}")
        return rubric

    @field_validator("criteria")
    @classmethod
    def _some_criteria(cls, criteria: tuple[Criterion, ...]) -> tuple[Criterion, ...]:
        # Checked after the items (not `min_length`), so one bad item is one problem, not two.
        if not criteria:
            raise ValueError("a checklist needs at least one criterion, e.g. [{ text = '...' }]")
        return criteria


@register_judge(ChecklistConfig)
class ChecklistJudge(Judge):
    """Asks which criteria a rollout meets; scores the weighted share met."""

    config: ChecklistConfig

    def placeholders(self, trajectory: Trajectory, task: Task | str) -> dict[str, str]:
        listed = "\n".join(f"{i}. {c.text}" for i, c in enumerate(self.config.criteria, 1))
        return {**super().placeholders(trajectory, task), "{criteria}": listed}

    def verdict(self, text: str) -> Verdict:
        if not text.strip():
            return Verdict(failure="empty_reply", error="the judge replied with no text")
        found = _last_checklist(text)
        if found is None:
            return Verdict(failure="parse_error", error="no JSON object with a `met` list in the reply")
        met, rationale = found
        criteria = self.config.criteria
        if len(met) != len(criteria):
            return Verdict(
                failure="parse_error", error=f"the reply answers {len(met)} criteria, not {len(criteria)}"
            )
        if any(m is None for m in met):
            return Verdict(failure="parse_error", error="each `met` entry must be true or false")
        total = sum(c.weight for c in criteria)
        score = sum(c.weight for c, m in zip(criteria, met, strict=True) if m) / total
        marks = "".join("y" if m else "n" for m in met)
        return Verdict(score=score, rationale=short(f"[{marks}] {rationale}"))


def _last_checklist(text: str) -> tuple[list[bool | None], str] | None:
    fields = last_json_object(text, "met")
    met = None if fields is None else fields["met"]
    if fields is None or not isinstance(met, list):
        return None
    return [_mark(m) for m in met], rationale_of(fields)


def _mark(value: object) -> bool | None:
    """true/false, or the words and 0/1 models write for them; anything else is unreadable."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return {"true": True, "yes": True, "false": False, "no": False}.get(value.strip().lower())
    return None
