"""The judge of a training run: `data.judge` made into the runner's judge, behind its robustness gate.

A run whose spec names a judge starts only if the newest `judge-audit` of that judge (model and
rubric) let it through, or the spec gives `override` with a reason; either way the run's record
says which audit (or which reason) it started on. The judge's replies are cached on disk under the
store, so replaying a judged rollout asks nothing and gets the same score.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from reprorl.config import RunSpec
from reprorl.config.judge import JudgeConfig, judge_id
from reprorl.errors import UserInputError
from reprorl.evaluation.judge import make_judge
from reprorl.orchestrate.run.judge_gate import require_robust_judge
from reprorl.rollout.judging import Judgement
from reprorl.store import RunRecord, Store
from reprorl.types import Task, Trajectory


def judge_cache(store_root: Path) -> Path:
    """Where every judge reply is cached: shared by runs, audits and replays of one store."""
    return Path(store_root) / "cache" / "judge"


class RunJudge:
    """A `Judge` as the runner's `RewardJudge`: requests on its own threads (`max_concurrency` of
    them, the judge's connection limit), so the event loop and the episodes go on meanwhile."""

    def __init__(self, config: JudgeConfig, cache_dir: Path) -> None:
        self._judge = make_judge(config, cache_dir)
        self._threads = ThreadPoolExecutor(config.max_concurrency, thread_name_prefix="reprorl-judge")
        self.judge_id = self._judge.judge_id

    @property
    def config(self) -> JudgeConfig:
        """The settings the judge's client was built with (what its requests use)."""
        return self._judge.config

    async def judge(self, task: Task, trajectory: Trajectory) -> Judgement:
        loop = asyncio.get_running_loop()
        score = await loop.run_in_executor(self._threads, self._judge.score, trajectory, task)
        if score.score is None:
            failure = f"{score.failure}: {score.error}" if score.error else str(score.failure)
            return Judgement(None, failure, score.cost_usd)
        return Judgement(score.score, None, score.cost_usd)

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        self._judge.close()


def run_judge(spec: RunSpec, store_root: Path) -> RunJudge | None:
    """The runner's judge for `spec`, or None when its rewards come from verifiers alone."""
    config = spec.data.judge
    return None if config is None else RunJudge(config, judge_cache(store_root))


def check_judge(store: Store, spec: RunSpec) -> dict[str, Any] | None:
    """The robustness gate for a new run: raises `UserInputError` naming the judge and the fix, or
    returns the event to record (`judge_robust`, or `judge_override` with the reason)."""
    config = spec.data.judge
    if config is None:
        return None
    if config.api_key_env is not None and not os.environ.get(config.api_key_env):
        raise UserInputError(
            f"environment variable {config.api_key_env} (the judge's API key) is not set; set it, or "
            "remove data.judge.api_key_env for a server that needs no key",
            field="data.judge.api_key_env",
        )
    return require_robust_judge(
        store, judge_id(config), override=config.override, override_hint="data.judge.override = '<reason>'"
    )


def record_judge(record: RunRecord, fields: dict[str, Any] | None) -> None:
    if fields is not None:
        event = dict(fields)
        record.event(event.pop("event"), **event)
