"""The rollback-rule engine: at every eval point, which rollback rules fire and whether the point passed.

`Guard` is built from the spec's `evaluation.rollback` rules (and the budget's `max_usd`, which a
`cost_cap` rule without a threshold uses). The train loop calls `Guard.check` once per eval step
with that step's `GuardPoint`s (one per suite); the verdict lists the `Firing`s, says whether the
point passed every rule (so the loop can remember the last good checkpoint) and which action
wins (`stop` over `revert`). The guard keeps the history the rules look back at (best earlier
required-task success, the reward-hacking window); `state_dict` / `load_state_dict` carry it
through a checkpoint, so a resumed run decides exactly as an uninterrupted one. Each condition is
a class in `reprorl.evaluation.guard_rules`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from reprorl.config.spec import RollbackRule
from reprorl.errors import UserInputError
from reprorl.evaluation.guard_facts import GuardPoint, GuardRecord, Observation
from reprorl.evaluation.guard_rules import CONDITIONS, DEFAULT_WINDOW, Condition
from reprorl.types import Task, Termination, ToolOutcome, Trajectory

if TYPE_CHECKING:
    from reprorl.evaluation.point import EvalPoint

Action = Literal["stop", "revert"]
REQUIRED_TAG = "required"
STATE_VERSION = 1
# Tool calls that failed through no fault of the model: the tool, its sandbox or the platform broke.
# The model's own mistakes (parse errors, unknown tools, bad arguments, refusals) are reported as
# invalid calls, and would make a weak policy look like broken tooling.
TOOL_FAULTS = frozenset(
    {ToolOutcome.TOOL_EXCEPTION, ToolOutcome.TOOL_TIMEOUT, ToolOutcome.SANDBOX_ERROR, ToolOutcome.INFRA_ERROR}
)


def required_task_ids(tasks: Iterable[Task]) -> frozenset[str]:
    """Ids of the tasks tagged `required` (generated task sets tag some; rules watch them)."""
    return frozenset(t.id for t in tasks if REQUIRED_TAG in t.tags)


def unsafe_count(trajectories: Iterable[Trajectory]) -> int:
    """How many rollouts ended with `Termination.UNSAFE_ACTION` (train rollouts for `Guard.check`)."""
    return sum(t.termination is Termination.UNSAFE_ACTION for t in trajectories)


def guard_point(point: EvalPoint, required: Iterable[str]) -> GuardPoint:
    """What the guards need of an eval point; `required` are the suite's required task ids."""
    outcomes = [o for t in point.trajectories for o in t.tool_outcomes()]
    prefix = f"eval/{point.suite}/"
    return GuardPoint(
        step=point.step,
        suite=point.suite,
        success=point.success.value,
        per_task=dict(point.per_task),
        required=frozenset(required),
        tool_calls=len(outcomes),
        tool_failures=sum(o in TOOL_FAULTS for o in outcomes),
        unsafe_actions=unsafe_count(point.trajectories),
        metrics={k.removeprefix(prefix): v for k, v in point.metrics().items()},
    )


@dataclass(frozen=True)
class Firing:
    """One rule that fired at `step`: the rule, the threshold it used, and the numbers that made it fire."""

    rule: RollbackRule
    threshold: float  # the rule's, or the condition's default, or the budget's max_usd
    step: int
    evidence: dict[str, Any]  # JSON-serialisable
    message: str

    @property
    def when(self) -> str:
        return self.rule.when

    @property
    def action(self) -> Action:
        return self.rule.action

    def to_json(self) -> dict[str, Any]:
        return {
            "when": self.when,
            "action": self.action,
            "metric": self.rule.metric,
            "threshold": self.threshold,
            "step": self.step,
            "evidence": self.evidence,
            "message": self.message,
        }


@dataclass(frozen=True)
class GuardVerdict:
    """The rules' decision at one eval step: what fired, whether it passed, and what to do."""

    step: int
    fired: tuple[Firing, ...] = ()

    @property
    def passed(self) -> bool:
        """No rule fired: this step's weights are a good checkpoint to come back to."""
        return not self.fired

    @property
    def action(self) -> Action | None:
        """`stop` if any firing says so (it is final), else `revert` if any does, else None."""
        actions = {f.action for f in self.fired}
        return "stop" if "stop" in actions else "revert" if actions else None

    def to_json(self) -> dict[str, Any]:
        fired = [f.to_json() for f in self.fired]
        return {"step": self.step, "passed": self.passed, "action": self.action, "fired": fired}


class Guard:
    """Checks each eval step against the run's rollback rules and keeps the history they look back at."""

    def __init__(
        self, rules: Sequence[RollbackRule], *, max_usd: float | None = None, window: int = DEFAULT_WINDOW
    ) -> None:
        """`window`: eval points in the reward-hacking trend (the rule itself has no field for it)."""
        if window < 2:
            raise UserInputError(f"a trend needs at least 2 eval points, got {window}", field="window")
        self.conditions: tuple[Condition, ...] = tuple(
            CONDITIONS[rule.when](rule, where=f"evaluation.rollback[{i}]", max_usd=max_usd, window=window)
            for i, rule in enumerate(rules)
        )
        self._history: list[GuardRecord] = []

    @property
    def history(self) -> tuple[GuardRecord, ...]:
        return tuple(self._history)

    @property
    def last_passed_step(self) -> int | None:
        """The latest checked step that passed every rule, if any."""
        return next((r.step for r in reversed(self._history) if r.passed), None)

    def check(
        self,
        points: Sequence[GuardPoint],
        *,
        train_reward: Mapping[int, float],
        cost_usd: float,
        train_unsafe_actions: int = 0,
        train_contradicted: Mapping[int, float] | None = None,
    ) -> GuardVerdict:
        """Check one eval step (one point per suite) and add it to the history.

        `train_reward` maps train step to that step's mean train reward; only the steps since the
        previous check are read (the whole run's mapping or just the new steps both work).
        `cost_usd` is the run's cumulative cost; `train_unsafe_actions` counts train rollouts that
        ended unsafely since the previous check (eval ones come with the points).
        `train_contradicted` maps train step to its `integrity/contradicted` share (steps where it is
        undefined are absent), read like `train_reward`.
        """
        if not points:
            raise ValueError("check needs at least one eval point")
        step = points[0].step
        if any(p.step != step for p in points):
            raise ValueError(
                f"eval points of one check must share a step, got {sorted({p.step for p in points})}"
            )
        if len({p.suite for p in points}) != len(points):
            raise ValueError(f"one eval point per suite, got {[p.suite for p in points]}")
        previous = self._history[-1].step if self._history else None
        if previous is not None and step <= previous:
            raise ValueError(f"step {step} was not after the last checked step {previous}; rewind() first")
        # The loop evaluates before training step `step`: this point measured the steps since the last.

        def measured(per_step: Mapping[int, float]) -> tuple[tuple[int, float], ...]:
            since = (s for s in sorted(per_step) if (previous is None or s >= previous) and s < step)
            return tuple((s, float(per_step[s])) for s in since)

        train = measured(train_reward)
        now = Observation(
            step,
            tuple(points),
            train,
            float(cost_usd),
            train_unsafe_actions,
            measured(train_contradicted or {}),
        )
        fired: list[Firing] = []
        for condition in self.conditions:
            finding = condition.evaluate(now, self._history)
            if finding is not None:
                fired.append(
                    Firing(condition.rule, condition.threshold, step, finding.evidence, finding.message)
                )
        required = {p.suite: r for p in points if (r := p.required_success())}
        self._history.append(GuardRecord(step, now.held_out, required, train, passed=not fired))
        return GuardVerdict(step, tuple(fired))

    def rewind(self, step: int) -> None:
        """Forget the checks at `step` and after, for a loop that resumes from an earlier step."""
        self._history = [r for r in self._history if r.step < step]

    def state_dict(self) -> dict[str, Any]:
        """The history as JSON-serialisable data (the rules come from the spec, not from here)."""
        return {"version": STATE_VERSION, "history": [r.to_json() for r in self._history]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"guard state version {state.get('version')!r}, expected {STATE_VERSION}")
        self._history = [GuardRecord.from_json(r) for r in state["history"]]
