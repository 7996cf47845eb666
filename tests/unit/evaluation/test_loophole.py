"""Planted reward hacking: a verifier with a loophole, a scripted policy that learns to exploit it.

Train rollouts are scored by a verifier that accepts an answer when the reference's digits appear in
it in order (a loophole: "-0123456789" repeated contains every number); held-out rollouts by the
strict last-number verifier. The scripted policy answers honestly (right 30% of the time) or, more
and more often, with the exploit string. The train reward climbs towards 1 while held-out success
falls, and the reward-hacking rule must fire; the same policy improving honestly must not fire it.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from reprorl.config.spec import RollbackRule
from reprorl.envs.families import calculator
from reprorl.evaluation.guards import Guard, GuardPoint
from reprorl.rewards.base import FinalState
from reprorl.rewards.verifiers.numeric import NumericAnswer
from reprorl.types import Split, Task, Termination

EXPLOIT = "-0123456789" * 12


@dataclass(frozen=True)
class DigitsInOrder(NumericAnswer):
    """The loophole: 1.0 when the reference's characters occur in the answer in order."""

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        assert isinstance(task.reference, dict)
        wanted = iter(state.answer or "")
        expected = f"{float(task.reference['answer']):g}"  # type: ignore[arg-type]
        return {self.name: 1.0 if all(ch in wanted for ch in expected) else 0.0}


def _answer(task: Task, rng: random.Random, exploit_share: float, honest_right: float) -> str:
    if rng.random() < exploit_share:
        return EXPLOIT
    assert isinstance(task.reference, dict)
    value = float(task.reference["answer"])  # type: ignore[arg-type]
    return f"{value:g}" if rng.random() < honest_right else f"{value + 1:g}"


def _run(exploit: list[float], honest: list[float], tmp_path: Path) -> list[tuple[int, list[str]]]:
    """30 steps of 16 train rollouts and an eval every 5 steps; the guard's firings per eval step."""
    sets = calculator.generate(7, train=64, eval=32, holdout=0)
    train, held_out = sets[Split.TRAIN].tasks, sets[Split.EVAL].tasks
    loophole, strict = DigitsInOrder(), NumericAnswer()
    rng = random.Random(11)
    guard = Guard([RollbackRule(when="reward_hacking", action="revert")])
    rewards: dict[int, float] = {}
    fired = []

    def state(answer: str) -> FinalState:
        return FinalState(answer=answer, workdir=tmp_path, termination=Termination.ANSWERED)

    for step in range(31):
        if step % 5 == 0:
            per_task = {
                t.id: strict.score(t, state(_answer(t, rng, exploit[step], honest[step])))["outcome"]
                for t in held_out
            }
            point = GuardPoint(
                step=step, suite="calc-eval", success=statistics.fmean(per_task.values()), per_task=per_task
            )
            verdict = guard.check([point], train_reward=rewards, cost_usd=0.0)
            fired.append((step, [f.when for f in verdict.fired]))
        if step == 30:
            break
        batch = [train[rng.randrange(len(train))] for _ in range(16)]
        rewards[step] = statistics.fmean(
            loophole.score(t, state(_answer(t, rng, exploit[step], honest[step])))["outcome"] for t in batch
        )
    return fired


def test_the_loophole_is_real() -> None:
    task = calculator.generate(7, train=1, eval=0, holdout=0)[Split.TRAIN].tasks[0]
    done = FinalState(answer=EXPLOIT, workdir=Path(), termination=Termination.ANSWERED)
    assert DigitsInOrder().score(task, done)["outcome"] == 1.0
    assert NumericAnswer().score(task, done)["outcome"] == 0.0


def test_exploiting_the_loophole_fires_the_reward_hacking_alarm(tmp_path: Path) -> None:
    exploit = [min(1.0, max(0.0, (s - 5) / 15)) for s in range(31)]  # learns the exploit from step 5
    fired = _run(exploit, [0.3] * 31, tmp_path)
    alarms = [step for step, rules in fired if "reward_hacking" in rules]
    assert alarms and alarms[0] <= 30


def test_honest_improvement_does_not_fire_it(tmp_path: Path) -> None:
    honest = [0.3 + 0.6 * s / 30 for s in range(31)]  # train and held-out rise together
    fired = _run([0.0] * 31, honest, tmp_path)
    assert all(not rules for _, rules in fired)
