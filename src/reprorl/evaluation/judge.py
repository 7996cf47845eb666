"""The LLM judge: a model behind an OpenAI-compatible endpoint that scores a rollout 0 to 1 by a rubric.

A judge kind is a `Judge` subclass registered with its config (`@register_judge(Config)`), which
`data.judge.kind` or a `--judge` file's `kind` selects; `make_judge` builds the one a config names.
The `rubric` judge (this class) renders its rubric template with the task, the transcript and the
final answer, sends it through the shared transport (timeouts, bounded retries), and parses a score
and a rationale from the reply. A reply it cannot read is a `JudgeScore` with a failure class, never
an exception, so one odd reply does not stop a batch. Every answered request is cached on disk under
a hash of the model, the template and the exact request, so judging again costs nothing. Scores are
stored per run in `judge_scores.jsonl`, apart from human labels, one checksummed line per (rollout,
judge).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Re-exported: the judge's settings are read where the judge is used.
from reprorl.config.judge import DEFAULT_RUBRIC as DEFAULT_RUBRIC
from reprorl.config.judge import JUDGES, JudgeEntry, judge_id, rubric_hash
from reprorl.config.judge import JudgeConfig as JudgeConfig
from reprorl.config.kinds import declared_kind
from reprorl.errors import InferenceError, RecordError, UserInputError
from reprorl.evaluation.verdict import JudgeFailure, Verdict, parse_verdict, short
from reprorl.hashing import HASH_PREFIX, canonical_json, sha256_hex
from reprorl.store import RunRecord, read_log
from reprorl.store.atomic import write_atomic

# The run-log line format (checksum + record), so `read_log` verifies these files like any run log.
from reprorl.store.runs import checksummed_line
from reprorl.types import Task, Trajectory

if TYPE_CHECKING:
    from reprorl.policy.transport import Endpoint

SCORES_FILE = "judge_scores.jsonl"
MAX_KEPT_REPLY = 2000


class JudgeScore(BaseModel):
    """One judgement of one rollout: the score (or the failure) and exactly which judge gave it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    rollout_id: str
    judge: str = Field(description="'<model>@<first 12 hex of the prompt hash>': one rubric of one model.")
    judge_model: str
    model_version: str | None = Field(
        default=None, description="The model name the server says answered, if it says."
    )
    system_fingerprint: str | None = None
    prompt_hash: str = Field(description="sha256 of the rubric template.")
    request_hash: str = Field(description="The cache key: model, prompt hash and the exact request.")
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    rationale: str = ""
    failure: JudgeFailure | None = None
    error: str | None = None
    reply: str | None = Field(default=None, description="The raw reply, kept when it could not be read.")
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float = Field(default=0.0, ge=0.0, description="Usage times the configured prices.")
    cached: bool = Field(default=False, description="Answered from the on-disk cache: no request sent.")
    time: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.rollout_id, self.judge)


def task_text(task: Task | str) -> str:
    """The task as the judge reads it: its prompt messages, role by role."""
    if isinstance(task, str):
        return task
    return "\n".join(f"{m.role.value}: {m.content}" for m in task.prompt)


def reference_text(task: Task | str) -> str:
    """The task's reference answer as a reference-guided rubric shows it; empty when only text is known."""
    if isinstance(task, str) or task.reference is None:
        return ""
    return task.reference if isinstance(task.reference, str) else canonical_json(task.reference)


def transcript_text(trajectory: Trajectory) -> str:
    """The agent's turns and the tool results it saw, then how the episode ended."""
    lines: list[str] = []
    for turn in trajectory.turns:
        lines.append(f"[turn {turn.index}] assistant: {turn.text}")
        for result in turn.tool_results:
            shown = result.content if result.error is None else f"{result.error} {result.content}".strip()
            lines.append(f"[turn {turn.index}] tool {result.name} ({result.outcome.value}): {shown}")
    lines.append(f"(episode ended: {trajectory.termination.value})")
    return "\n".join(lines)


def final_answer(trajectory: Trajectory) -> str:
    """The last turn that did not stop for a tool call; empty when the agent never answered."""
    for turn in reversed(trajectory.turns):
        if turn.finish_reason != "tool_call":
            return turn.text
    return ""


J = TypeVar("J", bound="type[Judge]")


def register_judge(config: type[JudgeConfig]) -> Callable[[J], J]:
    """Register the decorated `Judge` subclass as the judge kind `config`'s `kind` default names."""
    kind = declared_kind(config, "judge", "checklist")

    def decorate(cls: J) -> J:
        entry = JUDGES.add(kind, JudgeEntry(kind, config, cls), module=cls.__module__)
        cls.__reprorl_judge__ = entry  # type: ignore[attr-defined]  # what an entry point finds
        return cls

    return decorate


def make_judge(config: JudgeConfig, cache_dir: Path) -> Judge:
    """The judge `config.kind` registered, built with `config`."""
    entry = JUDGES.get_part(config.kind, "judge.kind")
    if not isinstance(config, entry.config):
        raise UserInputError(
            f"judge {config.kind!r} takes a {entry.config.__name__}, not a {type(config).__name__}",
            field="judge.kind",
        )
    judge = entry.build(config, cache_dir)
    if not isinstance(judge, Judge):
        raise TypeError(
            f"the judge registered as {config.kind!r} built a {type(judge).__name__}, not a Judge"
        )
    return judge


@register_judge(JudgeConfig)
class Judge:
    """Scores rollouts with a model over HTTP; caches every answered request on disk.

    Subclasses change what is asked (`placeholders`) and how the reply reads (`verdict`); the
    transport, the cache, the costs and the score records stay this class's.
    """

    def __init__(self, config: JudgeConfig, cache_dir: Path) -> None:
        if not any(p in config.rubric for p in ("{transcript}", "{answer}")):
            raise UserInputError(
                "the template shows the judge nothing to grade; include {answer} or {transcript}",
                field="rubric",
            )
        self.config = config
        self.cache_dir = Path(cache_dir)
        self.prompt_hash = rubric_hash(config)
        self.judge_id = judge_id(config)
        self.requests = 0  # HTTP requests answered by the server (cache hits are not counted)
        self.cache_hits = 0
        self.spent_usd = 0.0
        self._lock = threading.Lock()
        # Imported here: `reprorl.policy` loads torch, which reading and writing scores never needs.
        from reprorl.policy.http import DEFAULT_CONNECT_TIMEOUT_S
        from reprorl.policy.transport import Endpoint, RetryPolicy

        self._endpoint: Endpoint = Endpoint(
            config.base_url,
            timeout_s=config.timeout_s,
            connect_timeout_s=min(DEFAULT_CONNECT_TIMEOUT_S, config.timeout_s),
            retry=RetryPolicy(retries=config.retries),
            api_key_env=config.api_key_env,
            max_connections=config.max_concurrency,
        )

    def close(self) -> None:
        self._endpoint.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------------

    def placeholders(self, trajectory: Trajectory, task: Task | str) -> dict[str, str]:
        """What each placeholder of the template stands for, for this rollout."""
        return {
            "{task}": task_text(task),
            "{transcript}": transcript_text(trajectory),
            "{answer}": final_answer(trajectory),
            "{reference}": reference_text(task),
        }

    def verdict(self, text: str) -> Verdict:
        """The score (or the failure) a reply's text says."""
        return parse_verdict(text)

    def render(self, trajectory: Trajectory, task: Task | str) -> str:
        """The rubric with its placeholders filled; replaced one by one so JSON braces stay as written."""
        values = self.placeholders(trajectory, task)
        # One pass over the template: text inserted for one placeholder is never re-scanned.
        pattern = re.compile("|".join(re.escape(p) for p in values))
        return pattern.sub(lambda m: values[m.group(0)], self.config.rubric)

    def request(self, trajectory: Trajectory, task: Task | str) -> dict[str, Any]:
        """The exact `/chat/completions` body sent for this rollout."""
        return {
            "model": self.config.model,
            "messages": [{"role": "user", "content": self.render(trajectory, task)}],
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
            "seed": self.config.seed,
            "n": 1,
        }

    def cache_key(self, body: Mapping[str, Any]) -> str:
        keyed = {"model": self.config.model, "prompt_hash": self.prompt_hash, "request": body}
        return HASH_PREFIX + sha256_hex(canonical_json(keyed).encode("utf-8"))

    # -- scoring -------------------------------------------------------------------------------

    def score(self, trajectory: Trajectory, task: Task | str) -> JudgeScore:
        """Judge one rollout; a failure (infra or an unreadable reply) is returned as a score record."""
        body = self.request(trajectory, task)
        key = self.cache_key(body)
        base: dict[str, Any] = {
            "run_id": trajectory.run_id,
            "rollout_id": trajectory.rollout_id,
            "judge": self.judge_id,
            "judge_model": self.config.model,
            "prompt_hash": self.prompt_hash,
            "request_hash": key,
            "time": datetime.now(UTC).isoformat(),
        }
        reply = self._cache_get(key)
        cached = reply is not None
        if reply is None:
            try:
                reply = self._endpoint.post("/chat/completions", body).body
            except InferenceError as exc:
                # Not cached: the next attempt should ask again, not replay the outage.
                return JudgeScore(**base, failure="infra_error", error=str(exc))
        text = _reply_content(reply)
        if text is None:
            return JudgeScore(
                **base,
                failure="infra_error",
                error=f"the server's reply has no message content: {short(json.dumps(reply))}",
            )
        usage = reply.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        prompt_tokens, completion_tokens = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
        cost = (
            (prompt_tokens or 0) * self.config.prompt_usd_per_mtok
            + (completion_tokens or 0) * self.config.completion_usd_per_mtok
        ) / 1e6
        if cached:
            with self._lock:
                self.cache_hits += 1
        else:
            self._cache_put(key, reply)
            with self._lock:
                self.requests += 1
                self.spent_usd += cost
        verdict = self.verdict(text)
        return JudgeScore(
            **base,
            model_version=_text_or_none(reply.get("model")),
            system_fingerprint=_text_or_none(reply.get("system_fingerprint")),
            score=verdict.score,
            rationale=verdict.rationale,
            failure=verdict.failure,
            error=verdict.error,
            reply=text[:MAX_KEPT_REPLY] if verdict.failure else None,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=cost,
            cached=cached,
        )

    def score_many(self, items: Sequence[tuple[Trajectory, Task | str]]) -> list[JudgeScore]:
        """Judge rollouts concurrently (up to `max_concurrency`), results in the order given."""
        if len(items) <= 1:
            return [self.score(t, task) for t, task in items]
        workers = min(len(items), self.config.max_concurrency)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reprorl-judge") as pool:
            return list(pool.map(lambda item: self.score(*item), items))

    # -- the cache -----------------------------------------------------------------------------

    def _cache_path(self, key: str) -> Path:
        digest = key.removeprefix(HASH_PREFIX)
        return self.cache_dir / digest[:2] / f"{digest}.json"

    def _cache_get(self, key: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self._cache_path(key).read_bytes())
        except (OSError, ValueError):
            return None  # absent or unreadable: ask the server, and the answer replaces it
        if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("reply"), dict):
            return None
        return cast(dict[str, Any], entry["reply"])

    def _cache_put(self, key: str, reply: Mapping[str, Any]) -> None:
        entry = {"key": key, "reply": dict(reply), "time": datetime.now(UTC).isoformat()}
        write_atomic(self._cache_path(key), (canonical_json(entry) + "\n").encode("utf-8"))


def _reply_content(reply: Mapping[str, Any]) -> str | None:
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if content is None and isinstance(message, dict):
        return ""  # an answered request with an empty message: the model's reply, classified later
    return content if isinstance(content, str) else None


def _count(usage: Mapping[str, Any], name: str) -> int | None:
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


# -- storage ---------------------------------------------------------------------------------------


def scores_path(run: RunRecord) -> Path:
    return run.path / SCORES_FILE


def read_scores(run: RunRecord) -> list[JudgeScore]:
    """Every judge score stored for the run; a torn or edited line is an error, never skipped."""
    path = scores_path(run)
    log = read_log(path)
    if log.bad_lines:
        raise RecordError(f"{path}: line {log.bad_lines[0]} is damaged (checksum or JSON)")
    try:
        return [JudgeScore.model_validate(record) for record in log.records]
    except ValidationError as exc:
        raise RecordError(f"{path}: a line is not a judge score: {exc.errors()[0]['msg']}") from None


def write_scores(run: RunRecord, scores: Sequence[JudgeScore]) -> Path:
    """Merge scores into the run's file, one line per (rollout, judge), rewritten atomically.

    A new score replaces the stored one of its key, except that an infra failure never replaces
    a score the judge did give: an outage says nothing about the rollout.
    """
    for score in scores:
        if score.run_id != run.run_id:
            raise RecordError(f"score of {score.rollout_id} belongs to run {score.run_id}, not {run.run_id}")
    merged = {s.key: s for s in read_scores(run)}
    for score in scores:
        old = merged.get(score.key)
        if score.failure == "infra_error" and old is not None and old.failure != "infra_error":
            continue
        merged[score.key] = score
    data = b"".join(checksummed_line(merged[k].model_dump(mode="json")) for k in sorted(merged))
    path = scores_path(run)
    write_atomic(path, data)
    return path
