"""The LLM judge against a real HTTP server: FastAPI under uvicorn on 127.0.0.1 plays the judge model."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from reprorl.errors import RecordError, UserInputError
from reprorl.evaluation.judge import (
    DEFAULT_RUBRIC,
    SCORES_FILE,
    Judge,
    JudgeConfig,
    JudgeScore,
    parse_verdict,
    read_scores,
    write_scores,
)
from reprorl.hashing import content_hash
from reprorl.store import RunRecord, Store, read_log
from reprorl.types import Message, Role, Split, Task, Termination, ToolOutcome, ToolResult, Trajectory, Turn

USAGE = {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050}
SERVED_MODEL = "judge-model-2025-01-01"
# What the judge model answers, chosen by a marker in the final answer it is shown.
REPLIES = {
    "ANSWER-GOOD": '```json\n{"score": 0.9, "rationale": "The answer is correct."}\n```',
    "ANSWER-TEXT": "**Score:** 3/10\nRationale: misses the second part.",
    "ANSWER-GARBLED": "I would rather not say.",
    "ANSWER-HIGH": '{"score": 7, "rationale": "seven out of ten"}',
    "ANSWER-EMPTY": "",
}


@dataclass
class FakeJudge:
    """The server's view: every request it received (the HTTP call count), thread-safe."""

    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.received.clear()

    @property
    def calls(self) -> int:
        with self.lock:
            return len(self.received)


def judge_app(state: FakeJudge) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        with state.lock:
            state.received.append(body)
        prompt = body["messages"][-1]["content"]
        if "ANSWER-DOWN" in prompt:
            return JSONResponse({"error": "overloaded"}, status_code=503)
        if "ANSWER-NO-CHOICES" in prompt:
            return JSONResponse({"object": "chat.completion", "choices": []})
        text = next((reply for marker, reply in REPLIES.items() if marker in prompt), "score: 0.5")
        reply: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": SERVED_MODEL,
            "system_fingerprint": "fp_test",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
        }
        if "ANSWER-NO-USAGE" not in prompt:
            reply["usage"] = USAGE
        return JSONResponse(reply)

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[FakeJudge]:
    """uvicorn serving the fake judge from a background thread, on a port the OS picked."""
    state = FakeJudge()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(judge_app(state), log_level="warning", access_log=False, lifespan="off")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the judge server did not start"
        time.sleep(0.01)
    state.url = f"http://127.0.0.1:{port}/v1"
    try:
        yield state
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def fake(server: FakeJudge) -> FakeJudge:
    server.reset()
    return server


@pytest.fixture
def run(store: Store) -> RunRecord:
    spec = {"name": "judge-test"}
    return RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="judge", seeds={"root": 0})


TASK = Task(id="calc-1", family="calculator", prompt=(Message(role=Role.USER, content="What is 6 * 7?"),))


def rollout(answer: str, run_id: str = "run-1", number: int = 0) -> Trajectory:
    calc = ToolResult(call_id="c1", name="calculator", outcome=ToolOutcome.OK, content="42")
    return Trajectory(
        run_id=run_id,
        rollout_id=f"{run_id}/r{number:04d}",
        split=Split.EVAL,
        task_id=TASK.id,
        task_hash=TASK.content_hash,
        turns=(
            Turn(
                index=0, text="<tool_call>calc</tool_call>", tool_results=(calc,), finish_reason="tool_call"
            ),
            Turn(index=1, text=f"The answer is 42. {answer}", finish_reason="stop"),
        ),
        termination=Termination.ANSWERED,
    )


def judge(fake: FakeJudge, cache: Path, **overrides: Any) -> Judge:
    settings: dict[str, Any] = {
        "base_url": fake.url,
        "model": "judge-model",
        "prompt_usd_per_mtok": 3.0,
        "completion_usd_per_mtok": 15.0,
        "retries": 1,
        **overrides,
    }
    return Judge(JudgeConfig(**settings), cache)


COST = (1000 * 3.0 + 50 * 15.0) / 1e6


def test_a_reply_is_parsed_and_every_score_says_which_judge_gave_it(fake: FakeJudge, tmp_path: Path) -> None:
    with judge(fake, tmp_path / "cache") as j:
        score = j.score(rollout("ANSWER-GOOD"), TASK)
    assert score.score == 0.9 and score.rationale == "The answer is correct." and score.failure is None
    assert score.judge_model == "judge-model" and score.model_version == SERVED_MODEL
    assert score.system_fingerprint == "fp_test"
    template_hash = "sha256:" + hashlib.sha256(DEFAULT_RUBRIC.encode()).hexdigest()
    assert score.prompt_hash == template_hash and score.judge == f"judge-model@{template_hash[7:19]}"
    assert (score.prompt_tokens, score.completion_tokens) == (1000, 50)
    assert score.cost_usd == pytest.approx(COST) and j.spent_usd == pytest.approx(COST) and j.requests == 1
    assert fake.calls == 1
    sent = fake.received[0]
    assert sent["model"] == "judge-model" and sent["temperature"] == 0.0
    prompt = sent["messages"][0]["content"]
    # The task, the transcript (tool results included) and the final answer all reach the judge.
    assert "user: What is 6 * 7?" in prompt and "tool calculator (ok): 42" in prompt
    assert "Final answer:\nThe answer is 42. ANSWER-GOOD" in prompt and "(episode ended: answered)" in prompt
    assert '{"score": <a number from 0 to 1>' in prompt  # braces in the rubric are not placeholders


def test_judging_again_is_answered_from_the_disk_cache_with_no_request(
    fake: FakeJudge, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    with judge(fake, cache) as first:
        original = first.score(rollout("ANSWER-GOOD"), TASK)
    assert fake.calls == 1
    with judge(fake, cache) as again:  # a new process would start like this: only the disk is shared
        repeated = again.score(rollout("ANSWER-GOOD"), TASK)
        assert fake.calls == 1, "a cache hit must not reach the server"
        assert repeated.cached and not original.cached
        assert again.requests == 0 and again.cache_hits == 1 and again.spent_usd == 0.0
        assert repeated.model_dump(exclude={"cached", "time"}) == original.model_dump(
            exclude={"cached", "time"}
        )
        twin = again.score(rollout("ANSWER-GOOD", number=1), TASK)
        assert fake.calls == 1 and twin.cached, "an identical transcript is the same request"
        assert twin.rollout_id.endswith("r0001") and twin.score == original.score
        again.score(rollout("ANSWER-GOOD, said again", number=2), TASK)
        assert fake.calls == 2
    with judge(fake, cache, rubric="Grade it: {answer}. Reply with a score.") as other:
        changed = other.score(rollout("ANSWER-GOOD"), TASK)
    assert fake.calls == 3 and not changed.cached and changed.judge != original.judge


def test_unreadable_replies_are_classified_failures_and_the_batch_goes_on(
    fake: FakeJudge, tmp_path: Path, run: RunRecord
) -> None:
    markers = [
        "ANSWER-GOOD",
        "ANSWER-GARBLED",
        "ANSWER-HIGH",
        "ANSWER-EMPTY",
        "ANSWER-TEXT",
        "ANSWER-NO-USAGE",
    ]
    items = [(rollout(m, run.run_id, i), TASK) for i, m in enumerate(markers)]
    with judge(fake, tmp_path / "cache", max_concurrency=3) as j:
        scores = j.score_many(items)
    assert fake.calls == len(markers)
    assert [s.rollout_id for s in scores] == [t.rollout_id for t, _ in items]  # order kept
    by = dict(zip(markers, scores, strict=True))
    assert by["ANSWER-GOOD"].score == 0.9
    assert by["ANSWER-GARBLED"].failure == "parse_error" and by["ANSWER-GARBLED"].score is None
    assert by["ANSWER-GARBLED"].reply == "I would rather not say."  # the raw reply is kept as evidence
    assert by["ANSWER-HIGH"].failure == "out_of_range" and "7.0" in (by["ANSWER-HIGH"].error or "")
    assert by["ANSWER-EMPTY"].failure == "empty_reply"
    assert (
        by["ANSWER-TEXT"].score == pytest.approx(0.3)
        and by["ANSWER-TEXT"].rationale == "misses the second part."
    )
    no_usage = by["ANSWER-NO-USAGE"]
    assert no_usage.score == 0.5 and no_usage.prompt_tokens is None and no_usage.cost_usd == 0.0
    # A failed parse still cost tokens: spending counts every answered request.
    assert j.spent_usd == pytest.approx(COST * 5)
    path = write_scores(run, scores)
    assert path == run.path / SCORES_FILE
    assert read_scores(run) == sorted(scores, key=lambda s: s.key)


def test_an_outage_is_an_infra_failure_never_cached_and_never_replacing_a_score(
    fake: FakeJudge, tmp_path: Path, run: RunRecord
) -> None:
    with judge(fake, tmp_path / "cache", timeout_s=5.0) as j:
        down = j.score(rollout("ANSWER-DOWN", run.run_id), TASK)
        assert down.failure == "infra_error" and "503" in (down.error or "") and fake.calls == 2  # 1 retry
        j.score(rollout("ANSWER-DOWN", run.run_id), TASK)
        assert fake.calls == 4, "an outage must be asked again, not replayed from the cache"
        broken = j.score(rollout("ANSWER-NO-CHOICES", run.run_id, 1), TASK)
        assert broken.failure == "infra_error" and "no message content" in (broken.error or "")
        assert j.spent_usd == 0.0
    good = down.model_copy(update={"score": 0.8, "failure": None, "error": None})
    write_scores(run, [good])
    write_scores(run, [down])
    assert read_scores(run) == [good]


def test_the_scores_file_holds_one_checksummed_line_per_rollout_and_judge(run: RunRecord) -> None:
    def made(rollout_id: str, judge_id: str, value: float) -> JudgeScore:
        return JudgeScore(
            run_id=run.run_id,
            rollout_id=rollout_id,
            judge=judge_id,
            judge_model="m",
            prompt_hash="sha256:p",
            request_hash="sha256:r",
            score=value,
            time="2025-01-01T00:00:00+00:00",
        )

    write_scores(run, [made("a", "j1", 0.1), made("b", "j1", 0.2), made("a", "j2", 0.3)])
    write_scores(run, [made("a", "j1", 0.9)])  # judged again: replaces its own line only
    log = read_log(run.path / SCORES_FILE)
    assert not log.bad_lines and len(log.records) == 3
    assert {(s.rollout_id, s.judge): s.score for s in read_scores(run)} == {
        ("a", "j1"): 0.9,
        ("a", "j2"): 0.3,
        ("b", "j1"): 0.2,
    }
    assert not list(run.path.glob(".tmp-*"))
    with pytest.raises(RecordError, match="belongs to run"):
        write_scores(run, [made("a", "j1", 0.5).model_copy(update={"run_id": "other"})])
    path = run.path / SCORES_FILE
    path.write_text(
        path.read_text().replace('"score":0.2', '"score":1.0').replace('"score": 0.2', '"score": 1.0')
    )
    with pytest.raises(RecordError, match="line 3 is damaged"):
        read_scores(run)


@pytest.mark.parametrize(
    ("reply", "score", "failure"),
    [
        ('{"score": 1, "rationale": "all good"}', 1.0, None),
        ('Thinking... {"score": 0.2} no wait.\nFinal: {"Score": "0.6", "reason": "partly"}', 0.6, None),
        ("Score = 0.75", 0.75, None),
        ("score: 8/10 because it is mostly right", 0.8, None),
        ('{"score": true}', None, "parse_error"),
        ('{"score": "high"}', None, "parse_error"),
        ("Score: -0.1", None, "out_of_range"),
        ('{"score": 1.01}', None, "out_of_range"),
        ("score: 3/0", None, "out_of_range"),
        ("looks fine to me", None, "parse_error"),
        ("   \n", None, "empty_reply"),
    ],
)
def test_parse_verdict(reply: str, score: float | None, failure: str | None) -> None:
    verdict = parse_verdict(reply)
    assert (verdict.score, verdict.failure) == (pytest.approx(score) if score is not None else None, failure)
    assert (verdict.error is None) == (failure is None)


def test_rationale_is_short_and_taken_from_the_reply() -> None:
    assert (
        parse_verdict('{"score": 0.4, "explanation": "  too\n long\t spaces "}').rationale
        == "too long spaces"
    )
    assert len(parse_verdict(json.dumps({"score": 0.4, "rationale": "x" * 5000})).rationale) == 500


def test_a_rubric_that_shows_nothing_to_grade_is_refused_in_one_line(fake: FakeJudge, tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"^rubric: .*\{answer\} or \{transcript\}"):
        judge(fake, tmp_path, rubric="Is this good? {task}")
    with pytest.raises(ValueError, match="extra"):
        JudgeConfig(base_url=fake.url, model="m", temprature=0.0)  # type: ignore[call-arg]


def test_a_reference_guided_rubric_shows_the_judge_the_reference_answer(
    fake: FakeJudge, tmp_path: Path
) -> None:
    rubric = "Reference: {reference}\nAnswer: {answer}\nReply with JSON {score}."
    task = TASK.model_copy(update={"reference": {"answer": 42}})
    with judge(fake, tmp_path, rubric=rubric) as j:
        assert j.render(rollout("ANSWER-GOOD"), task).startswith(
            'Reference: {"answer":42}\nAnswer: The answer'
        )
        assert j.render(rollout("ANSWER-GOOD"), "What is 6 * 7?").startswith("Reference: \n")
        plain = TASK.model_copy(update={"reference": "42"})
        assert j.render(rollout("ANSWER-GOOD"), plain).endswith("Reply with JSON {score}.")
        assert j.render(rollout("ANSWER-GOOD"), plain).startswith("Reference: 42\n")
        # A different reference is a different request, so the cache never answers for the wrong one.
        assert j.cache_key(j.request(rollout("ANSWER-GOOD"), task)) != j.cache_key(
            j.request(rollout("ANSWER-GOOD"), plain)
        )
