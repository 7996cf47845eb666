"""Judge kinds by registration: `data.judge.kind` (or a `--judge` file's) picks the registered judge,
whose own config validates the table; the checklist judge scores the weighted share of criteria met."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from judge_server import serve
from reprorl import Judge, JudgeConfig, register_judge
from reprorl.config import JUDGES, RunSpec
from reprorl.config.judge import DEFAULT_RUBRIC, judge_id
from reprorl.config.load import load_judge_config
from reprorl.errors import UserInputError
from reprorl.evaluation.checklist import ChecklistConfig, ChecklistJudge
from reprorl.evaluation.judge import make_judge
from reprorl.evaluation.verdict import Verdict
from reprorl.orchestrate.run.judge_reward import run_judge
from reprorl.types import Message, Role, Split, Task, Termination, Trajectory, Turn

TASK = Task(id="t-1", family="calculator", prompt=(Message(role=Role.USER, content="What is 6 * 7?"),))
CRITERION = re.compile(r"^(\d+)\. the answer says (.+)$", re.MULTILINE)


def checklist_app(received: list[str]) -> FastAPI:
    """A judge model that checks each numbered criterion "the answer says X" against the final answer."""
    api = FastAPI()

    @api.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        prompt = (await request.json())["messages"][-1]["content"]
        received.append(prompt)
        answer = prompt.split("Final answer:\n", 1)[1].split("\n\nCriteria:", 1)[0]
        met: list[Any] = [word in answer for _, word in CRITERION.findall(prompt)]
        if "SHORT" in answer:
            met = met[:-1]  # forgets the last criterion
        if "MAYBE" in answer:
            met[0] = "maybe"
        text = json.dumps({"met": met, "rationale": "checked each criterion"})
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return JSONResponse({"object": "chat.completion", "model": "checker", "choices": [choice]})

    return api


@pytest.fixture(scope="module")
def checker() -> Iterator[tuple[str, list[str]]]:
    received: list[str] = []
    with serve(checklist_app(received)) as url:
        yield url, received


def rollout(answer: str) -> Trajectory:
    return Trajectory(
        run_id="run-1",
        rollout_id="run-1/r0000",
        split=Split.TRAIN,
        task_id=TASK.id,
        task_hash=TASK.content_hash,
        turns=(Turn(index=0, text=answer, finish_reason="stop"),),
        termination=Termination.ANSWERED,
    )


def checklist(url: str, **changes: Any) -> JudgeConfig:
    table: dict[str, Any] = {
        "kind": "checklist",
        "base_url": url,
        "model": "checker",
        "retries": 0,
        "criteria": [{"text": "the answer says 42", "weight": 3.0}, {"text": "the answer says units"}],
        **changes,
    }
    return RunSpec.model_validate(_spec(table)).data.judge  # type: ignore[return-value]


def _spec(judge: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "judged",
        "seed": 0,
        "model": {"owner": "o", "base": "tiny@sha256:" + "0" * 64},
        "data": {
            "owner": "o",
            "train": "calc-train@sha256:" + "1" * 64,
            "reward_weights": {"outcome": 1.0, "judge": 1.0},
            "judge": judge,
        },
        "learning": {"owner": "o"},
        "evaluation": {"owner": "o", "suites": ["calc-eval@sha256:" + "2" * 64]},
    }


def test_the_checklist_scores_the_weighted_share_of_criteria_met(
    checker: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, received = checker
    config = checklist(url)
    assert isinstance(config, ChecklistConfig)
    with make_judge(config, tmp_path) as judge:
        assert isinstance(judge, ChecklistJudge)
        right = judge.score(rollout("It is 42."), TASK)
        both = judge.score(rollout("It is 42 units."), TASK)
        neither = judge.score(rollout("It is 41."), TASK)
    assert (right.score, both.score, neither.score) == (0.75, 1.0, 0.0)
    assert right.rationale.startswith("[yn]") and both.rationale.startswith("[yy]")
    # The criteria were shown numbered, in order, inside the checklist rubric.
    assert "Criteria:\n1. the answer says 42\n2. the answer says units\n" in received[-1]


def test_a_reply_that_does_not_answer_every_criterion_is_a_parse_error_not_a_partial_score(
    checker: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, _ = checker
    with make_judge(checklist(url), tmp_path) as judge:
        short = judge.score(rollout("42 SHORT"), TASK)
        unsure = judge.score(rollout("42 MAYBE"), TASK)
    assert (
        short.score is None
        and short.failure == "parse_error"
        and "answers 1 criteria, not 2" in str(short.error)
    )
    assert unsure.score is None and unsure.failure == "parse_error"
    assert short.reply is not None  # the unreadable reply is kept in the record


def test_the_criteria_and_their_weights_are_part_of_the_judges_identity(
    checker: tuple[str, list[str]],
) -> None:
    url, _ = checker
    base = checklist(url)
    reweighed = checklist(url, criteria=[{"text": "the answer says 42"}, {"text": "the answer says units"}])
    assert judge_id(base) != judge_id(reweighed)
    assert judge_id(base) == judge_id(checklist(url, timeout_s=5.0))  # transport settings are not
    # A table without `kind` is the rubric judge, named as records made before kinds were: by the rubric.
    old = RunSpec.model_validate(_spec({"base_url": url, "model": "m"})).data.judge
    assert old is not None and old.kind == "rubric" and type(old) is JudgeConfig
    assert judge_id(old) == "m@" + hashlib.sha256(DEFAULT_RUBRIC.encode()).hexdigest()[:12]


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"kind": "checklist"}, "data.judge.criteria"),
        ({"kind": "checklist", "criteria": [{"text": "x"}], "rubric": "{answer}"}, "include {criteria}"),
        ({"kind": "checklist", "criteria": [{"text": "x", "weight": 0}]}, "data.judge.criteria[0].weight"),
        ({"kind": "checklist", "criteria": [{"text": "x"}], "critera": []}, "data.judge.critera"),
        ({"kind": "rubric", "criteria": [{"text": "x"}]}, "data.judge.criteria"),
        ({"kind": "panel"}, "no judge 'panel'; judges: checklist, rubric"),
    ],
)
def test_a_bad_judge_table_is_one_line_naming_the_field(table: dict[str, Any], says: str) -> None:
    from reprorl.config.load import validate_spec

    with pytest.raises(UserInputError) as caught:
        validate_spec(_spec({"base_url": "http://127.0.0.1:9/v1", "model": "m", **table}))
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_judge_file_takes_kinds_and_refuses_a_run_only_override(tmp_path: Path) -> None:
    path = tmp_path / "judge.toml"
    path.write_text(
        'kind = "checklist"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n[[criteria]]\ntext = "x"\n'
    )
    assert isinstance(load_judge_config(path), ChecklistConfig)
    path.write_text('base_url = "http://127.0.0.1:9/v1"\nmodel = "m"\noverride = "trust me"\n')
    with pytest.raises(UserInputError, match=r"override.*belongs in a run spec"):
        load_judge_config(path)


class Strict(JudgeConfig):
    kind: str = "strict"
    passing: float = 0.5


def test_a_registered_judge_kind_is_selected_by_name_in_a_run_spec(
    checker: tuple[str, list[str]], tmp_path: Path
) -> None:
    """A judge kind from outside: its config's own field validates and reaches the judge a run builds."""
    url, _ = checker

    class Threshold(Judge):
        config: Strict

        def verdict(self, text: str) -> Verdict:
            met = json.loads(text)["met"]
            return Verdict(score=1.0 if sum(met) / len(met) >= self.config.passing else 0.0)

        def placeholders(self, trajectory: Trajectory, task: Task | str) -> dict[str, str]:
            return {**super().placeholders(trajectory, task), "{criteria}": "1. the answer says 42"}

    rubric = "Final answer:\n{answer}\n\nCriteria:\n{criteria}\n"
    entry = register_judge(Strict)(Threshold).__reprorl_judge__  # type: ignore[attr-defined]
    JUDGES.remove("strict")
    with JUDGES.override("strict", entry):
        spec = RunSpec.model_validate(
            _spec({"kind": "strict", "base_url": url, "model": "m", "rubric": rubric})
        )
        assert isinstance(spec.data.judge, Strict) and spec.data.judge.passing == 0.5
        run = run_judge(spec, tmp_path)
        assert run is not None and isinstance(run.config, Strict)
        try:
            judged = asyncio.run(run.judge(TASK, rollout("42")))
            missed = asyncio.run(run.judge(TASK, rollout("41")))
        finally:
            run.close()
    assert (judged.score, missed.score) == (1.0, 0.0)
    assert "strict" not in JUDGES
    with pytest.raises(UserInputError, match="no judge 'strict'"):
        from reprorl.config.load import validate_spec

        validate_spec(_spec({"kind": "strict", "base_url": url, "model": "m"}))
