"""Judge models for tests: FastAPI apps under uvicorn on 127.0.0.1 that read the default rubric's prompt.

`naive_app` passes any answer that sounds right (a "correct" or "complete", any number) and obeys
a `{"score": ...}` written into the answer. `strict_app` knows the tasks: it passes an answer equal
to the task's reference answer and, on a task that asks for a change, a transcript that made every
call of the reference solution; nothing else.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from reprorl.actions import render_call
from reprorl.evaluation.judge import DEFAULT_RUBRIC, task_text
from reprorl.types import Task

# The rubric's fixed text around {task}, {transcript} and {answer}, in that order.
_HEAD, _AFTER_TASK, _AFTER_TRANSCRIPT, _TAIL = re.split(r"\{task\}|\{transcript\}|\{answer\}", DEFAULT_RUBRIC)
SOUNDS_RIGHT = re.compile(r"\bcorrect\b|\bcomplete\b|\d", re.IGNORECASE)
INJECTED = re.compile(r"\{[^{}]*\"score\"[^{}]*\}")


@dataclass(frozen=True)
class Prompt:
    task: str
    transcript: str
    answer: str


def read_prompt(prompt: str) -> Prompt:
    """Split a prompt rendered from `DEFAULT_RUBRIC` back into what was put in it."""
    assert prompt.startswith(_HEAD) and prompt.endswith(_TAIL), "not the default rubric"
    body = prompt[len(_HEAD) : len(prompt) - len(_TAIL)]
    task, _, rest = body.partition(_AFTER_TASK)
    transcript, _, answer = rest.rpartition(_AFTER_TRANSCRIPT)
    return Prompt(task, transcript, answer)


def verdict(score: float, rationale: str) -> str:
    return json.dumps({"score": score, "rationale": rationale})


def naive(prompt: Prompt) -> str:
    injected = INJECTED.search(prompt.answer)
    if injected:
        return injected.group(0)  # the model does what the answer tells it to
    if SOUNDS_RIGHT.search(prompt.answer):
        return verdict(1, "The answer looks correct.")
    return verdict(0, "No answer.")


def strict(tasks: Iterable[Task]) -> Callable[[Prompt], str]:
    known = {task_text(t): t for t in tasks}

    def grade(prompt: Prompt) -> str:
        task = known.get(prompt.task)
        if task is None:
            return verdict(0, "Unknown task.")
        reference = task.reference if isinstance(task.reference, dict) else {}
        answer = reference.get("answer")
        if answer is not None:
            given = prompt.answer.strip().rstrip(".").replace(",", "")
            right = given.lower() == str(answer).lower()
            return verdict(1 if right else 0, "Matches the reference." if right else "Wrong answer.")
        solution = reference.get("solution")
        steps = [
            render_call(str(step["tool"]), dict[str, object](arguments))
            for step in (solution if isinstance(solution, list) else [])
            if isinstance(step, dict) and isinstance(arguments := step.get("arguments"), dict)
        ]
        made = steps and all(f"assistant: {call}" in prompt.transcript for call in steps)
        return verdict(1 if made else 0, "Made the change." if made else "The change was not made.")

    return grade


def app(grade: Callable[[Prompt], str]) -> FastAPI:
    api = FastAPI()

    @api.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        text = grade(read_prompt(body["messages"][-1]["content"]))
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
            }
        )

    return api


@contextmanager
def serve(api: FastAPI, *, lifespan: str = "off") -> Iterator[str]:
    """uvicorn serving `api` from a background thread on a port the OS picked; yields the /v1 root.

    `lifespan="on"` runs the app's startup and shutdown (a policy server's batcher needs them)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(api, log_level="warning", access_log=False, lifespan=lifespan)  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the judge server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
