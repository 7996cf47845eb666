"""The `data.judge` table and the judge registry: an LLM judge chosen by `kind`, with its server and rubric.

Every judge kind registers itself with its config model (`reprorl.register_judge`), built-in or from
an installed package (entry-point group `reprorl.judges`), so the spec knows a judge only by name.
The fields here are what every LLM judge shares (where the model is served, what its tokens cost);
a kind's config adds its own. Without `kind` a table is the `rubric` judge, the one-score judge
records written before kinds existed used. The judge itself (requests, parsing, the cache) is
`reprorl.evaluation.judge`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, WrapValidator

from reprorl.config.kinds import kind_validator
from reprorl.hashing import HASH_PREFIX, canonical_json, sha256_hex
from reprorl.registry import Registry

DEFAULT_KIND = "rubric"

ATTEMPT = """Task:
{task}

Transcript (the agent's turns and the tool results it saw):
{transcript}

Final answer:
{answer}"""
"""The rollout as the built-in templates show it."""

DEFAULT_RUBRIC = (
    """You are grading an AI agent's attempt at a task.

"""
    + ATTEMPT
    + """

Score how well the final answer accomplishes the task, from 0 (wrong or missing) to 1 (fully correct).
Reply with only a JSON object: {"score": <a number from 0 to 1>, "rationale": "<one short sentence>"}"""
)


class JudgeConfig(BaseModel):
    """Where the judge model is served, what it is asked, and what its tokens cost: the `rubric` judge."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(
        default=DEFAULT_KIND,
        description="The registered judge: 'rubric' (one score from the rubric template), 'checklist' "
        "(the weighted share of `criteria` the reply says are met), or a judge an installed package "
        "registers.",
    )
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
    override: str | None = Field(
        default=None,
        description="Only in a run spec: why to train on this judge although its robustness audit "
        "refused it or never ran; recorded on the run as a judge_override event.",
    )

    def prompt_text(self) -> str:
        """What decides the score besides the model and the rollout; its hash names the judge.

        For the `rubric` judge that is its template alone (as before kinds existed); another kind adds
        its name and its own fields (a checklist's criteria, a threshold), so changing one of them is a
        new judge with its own audit. The transport and the prices never are.
        """
        own = {k: v for k, v in self.model_dump(mode="json").items() if k not in JudgeConfig.model_fields}
        if self.kind == DEFAULT_KIND and not own:
            return self.rubric
        return canonical_json({"kind": self.kind, "rubric": self.rubric, **own})

    @classmethod
    def variants(cls) -> list[type[BaseModel]]:
        """The built-in judges' configs, for the spec reference."""
        # The default kind first: it is the table most specs write.
        names = sorted(JUDGES.builtin_names(), key=lambda name: name != DEFAULT_KIND)
        return [JUDGES[name].config for name in names]


@dataclass(frozen=True)
class JudgeEntry:
    """A registered judge kind: its config model and the judge class (or factory) it builds."""

    kind: str
    config: type[JudgeConfig]
    build: Callable[[Any, Path], Any]  # (config, cache_dir) -> a judge with `score` and `score_many`

    @property
    def identity(self) -> tuple[str, str]:
        return self.build.__module__, self.build.__qualname__


def _accept(name: str, loaded: object) -> JudgeEntry | None:
    entry = getattr(loaded, "__reprorl_judge__", None)
    return entry if isinstance(entry, JudgeEntry) else None


JUDGES: Registry[JudgeEntry] = Registry(
    "judge",
    "reprorl.judges",
    builtins=("reprorl.evaluation.judge", "reprorl.evaluation.checklist"),
    accept=_accept,
)

_validate_judge = kind_validator(
    JUDGES,
    lambda entry: entry.config,
    base=JudgeConfig,
    default=DEFAULT_KIND,
    example="{ kind = 'rubric', base_url = 'http://127.0.0.1:8000/v1', model = 'judge' }",
)

JudgeTable = Annotated[SerializeAsAny[JudgeConfig], WrapValidator(_validate_judge)]
"""A judge's settings validated by the config its `kind` registered (`data.judge`, `--judge FILE`)."""


def judge_id(config: JudgeConfig) -> str:
    """'<model>@<first 12 hex of the prompt's hash>': one rubric of one model, as scores name it."""
    return f"{config.model}@{rubric_hash(config).removeprefix(HASH_PREFIX)[:12]}"


def rubric_hash(config: JudgeConfig) -> str:
    return HASH_PREFIX + sha256_hex(config.prompt_text().encode("utf-8"))
