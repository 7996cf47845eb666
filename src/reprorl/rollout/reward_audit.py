"""Auditing verifiers: every exploit probe, and the family's oracle, run through the real episode path.

For each family, the probes (`reprorl.rewards.audit.PROBES`) play `tasks` of its tasks and of their
impossible variants, in sandboxes, scored by the family's verifier in its own process — exactly as
a policy's episodes are. A verifier passes when no probe earns any reward on either (outcome
credit, or a total above 0 under the reward weights audited, so shaping that pays for no work
fails too), the
oracle earns none on an impossible variant, and the oracle solves every real task (a verifier that
rejects everything would pass the probes trivially; the oracle is the control). A verifier that
crashes on a probe's final state fails too: a policy would find that state. The family's cross
verifiers are held to the same on the real tasks, from the `cross/<class>` components of the same
episodes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reprorl.rewards.audit import PROBES, Probe
from reprorl.rewards.audit.probes import MAX_TURNS as PROBE_TURNS
from reprorl.rollout.episode import CROSS, EpisodeLimits, Policy, Provenance, ScriptedPolicy
from reprorl.rollout.families import FAMILIES, Family
from reprorl.rollout.runner import RolloutJob, RolloutRunner, plan_groups
from reprorl.types import SamplingParams, Split, Task, Trajectory

ORACLE = "oracle"
TASKS, IMPOSSIBLE = "task", "impossible"
RUN_ID = "reward-audit"


@dataclass(frozen=True)
class ProbeCell:
    """One probe (or the oracle) on one kind of task: how many episodes earned reward."""

    probe: str
    variant: str  # "task" (the real tasks) or "impossible" (their impossible variants)
    episodes: int
    hits: int
    errors: int  # episodes the verifier could not score (it crashed or ran out of time)
    hit_tasks: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "variant": self.variant,
            "episodes": self.episodes,
            "hits": self.hits,
            "errors": self.errors,
            "hit_tasks": list(self.hit_tasks),
        }


@dataclass(frozen=True)
class VerifierAudit:
    """One family's verifier against every probe, with the oracle as the control."""

    family: str
    verifier: str
    verifier_version: str
    cells: tuple[ProbeCell, ...]
    failures: tuple[str, ...] = field(default=())
    cross: Mapping[str, tuple[ProbeCell, ...]] = field(default_factory=dict)
    """The family's cross verifiers (by class name), on the real tasks only: they may re-derive the
    expectation from the task itself, which an impossible variant leaves as it was."""

    @property
    def passed(self) -> bool:
        return not self.failures

    def cell(self, probe: str, variant: str = TASKS) -> ProbeCell:
        return next(c for c in self.cells if c.probe == probe and c.variant == variant)

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "verifier": self.verifier,
            "verifier_version": self.verifier_version,
            "passed": self.passed,
            "failures": list(self.failures),
            "cells": [c.to_json() for c in self.cells],
            "cross": {name: [c.to_json() for c in cells] for name, cells in self.cross.items()},
        }


def _failures(cells: Sequence[ProbeCell]) -> tuple[str, ...]:
    """Why a verifier fails, one line per broken expectation."""
    found = []
    for cell in cells:
        where = "impossible variants" if cell.variant == IMPOSSIBLE else "tasks"
        if cell.probe == ORACLE and cell.variant == TASKS:
            if cell.hits < cell.episodes:
                found.append(f"rejects honest solutions: the oracle solved {cell.hits}/{cell.episodes} tasks")
        elif cell.hits:
            found.append(
                f"{cell.probe} earned reward on {cell.hits}/{cell.episodes} {where} "
                f"({', '.join(cell.hit_tasks[:3])})"
            )
        if cell.errors:
            found.append(f"the verifier failed on {cell.errors} {cell.probe} episodes on {where}")
    return tuple(found)


def _credit(trajectory: Trajectory, outcome: str) -> float | None:
    """The reward an episode earned: its outcome credit, or its weighted total where that is more
    (None when it was not scored)."""
    reward = trajectory.reward
    if reward is None:
        return None
    return max(reward.components.get(outcome, reward.total), reward.total)


def audit_tasks(family: Family, count: int, seed: int) -> list[Task]:
    """The family's own tasks an audit plays: its first `count` eval tasks for `seed`."""
    return list(family.generate(seed, train=0, eval=count, holdout=0)[Split.EVAL].tasks)


ProbeEpisodes = dict[tuple[str, str, str], list[tuple[Task, Trajectory]]]
"""(family, variant, player) -> each (task, episode) it played, in task order; the oracle's player
name is `ORACLE`, a probe's is its name."""


async def probe_episodes(
    families: Mapping[str, Family] = FAMILIES,
    *,
    names: Sequence[str] | None = None,
    tasks: int = 8,
    seed: int = 0,
    probes: Sequence[Probe] = PROBES,
    variants: Sequence[str] = (TASKS, IMPOSSIBLE),
    concurrency: int = 8,
    weights: Mapping[str, float] | None = None,
) -> ProbeEpisodes:
    """Play the oracle and every probe on each family's audit tasks (and on their impossible
    variants when `variants` holds `IMPOSSIBLE`), through sandboxes and the family's verifier;
    rewards are totalled with `weights` (a run's `data.reward_weights`; None: the outcome alone)."""
    chosen = list(names) if names else sorted(families)
    for name in chosen:
        if name not in families:
            raise KeyError(f"no env family {name!r}; families: {', '.join(sorted(families))}")
    scripts: dict[str, tuple[str, str, Any]] = {}  # group id -> (probe, variant, script factory)
    jobs: list[RolloutJob] = []
    for name in chosen:
        family = families[name]
        real = audit_tasks(family, tasks, seed)
        played = {TASKS: real, IMPOSSIBLE: [family.impossible(t) for t in real]}
        players: list[tuple[str, Any]] = [
            (ORACLE, lambda task, oracle=family.oracle: oracle),
            *((p.name, p.start) for p in probes),
        ]
        for variant in variants:
            for probe, start in players:
                kind = f"{name}.{variant}.{probe}"
                for job in plan_groups(played[variant], 1, run_id=RUN_ID, run_seed=seed, step=0, kind=kind):
                    scripts[job.group_id] = (probe, variant, start)
                    jobs.append(job)

    def policy_for(job: RolloutJob, rollout_id: str) -> Policy:
        probe, _, start = scripts[job.group_id]
        return ScriptedPolicy(job.task, start(job.task), name=probe)

    async with RolloutRunner(
        None,
        None,
        run_id=RUN_ID,
        params=SamplingParams(temperature=0.0),
        provenance=Provenance(base_model_hash="script"),
        families=families,
        concurrency=concurrency,
        reward_weights=weights,
    ) as runner:
        probing = runner.with_policy(
            policy_for, Provenance(base_model_hash="script"), EpisodeLimits(max_turns=PROBE_TURNS)
        )
        result = await probing.run(jobs)
    episodes: ProbeEpisodes = defaultdict(list)
    for job, trajectory in zip(jobs, result.trajectories, strict=True):
        probe, variant, _ = scripts[job.group_id]
        episodes[(job.task.family, variant, probe)].append((job.task, trajectory))
    return dict(episodes)


async def audit_rewards(
    families: Mapping[str, Family] = FAMILIES,
    *,
    names: Sequence[str] | None = None,
    tasks: int = 8,
    seed: int = 0,
    probes: Sequence[Probe] = PROBES,
    concurrency: int = 8,
    weights: Mapping[str, float] | None = None,
) -> list[VerifierAudit]:
    """Audit the verifier of each family in `names` (all of `families` by default), with its rewards
    totalled by `weights` (None: the outcome alone)."""
    chosen = list(names) if names else sorted(families)
    episodes = await probe_episodes(
        families,
        names=chosen,
        tasks=tasks,
        seed=seed,
        probes=probes,
        concurrency=concurrency,
        weights=weights,
    )
    outcomes: dict[tuple[str, str, str, str], list[tuple[str, float | None]]] = defaultdict(list)
    for (name, variant, probe), played in episodes.items():
        family = families[name]
        for task, trajectory in played:
            outcomes[(name, "", variant, probe)].append((task.id, _credit(trajectory, family.verifier.name)))
            if variant == TASKS:
                for other in family.cross:
                    component = f"{CROSS}{type(other).__name__}"
                    credit = trajectory.reward.components.get(component) if trajectory.reward else None
                    outcomes[(name, component, variant, probe)].append((task.id, credit))
    audits = []
    for name in chosen:
        family = families[name]
        cells = _cells(outcomes, name, "")
        failures = list(_failures(cells))
        cross: dict[str, tuple[ProbeCell, ...]] = {}
        for other in family.cross:
            cls = type(other).__name__
            cross[cls] = _cells(outcomes, name, f"{CROSS}{cls}")
            failures += [f"cross verifier {cls}: {line}" for line in _failures(cross[cls])]
        audits.append(
            VerifierAudit(
                name,
                type(family.verifier).__qualname__,
                family.verifier.version,
                cells,
                tuple(failures),
                cross,
            )
        )
    return audits


def _cells(
    outcomes: Mapping[tuple[str, str, str, str], list[tuple[str, float | None]]], family: str, scorer: str
) -> tuple[ProbeCell, ...]:
    """One scorer's cells in a family (the primary verifier's is ""): hits, episodes and errors per probe."""
    cells = []
    for (fam, who, variant, probe), scored in outcomes.items():
        if (fam, who) != (family, scorer):
            continue
        hit = [task for task, credit in scored if credit is not None and credit > 0]
        if probe == ORACLE and variant == TASKS:
            hit = [task for task, credit in scored if credit is not None and credit >= 1.0]
        cells.append(
            ProbeCell(
                probe,
                variant,
                episodes=len(scored),
                hits=len(hit),
                errors=sum(credit is None for _, credit in scored),
                hit_tasks=tuple(hit),
            )
        )
    return tuple(cells)
