"""Audit evidence that a run can be recreated: a seeded sample of its rollouts replays, every weight loads.

Presence of records is not proof. Question 9 replays, in recorded mode, one rollout drawn (seeded by
the run's seed) at the earliest and at the latest step of each split, and checks that every policy
version the rollouts name can be opened: the run's kept versions load and hash to their names.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

from reprorl.audit.facts import Finding, RunFacts, short
from reprorl.errors import ReprorlError
from reprorl.orchestrate.jobs.replay import Replayer
from reprorl.orchestrate.jobs.replay_policy import TRAINED_KINDS
from reprorl.orchestrate.run.kept_versions import GoneError, kept_tensors
from reprorl.store.runs import VERSIONS_FILE

Row = dict[str, Any]


def _sampled(rows: list[Row]) -> list[Row]:
    """Rollouts a model sampled (not retried, not scripted, not an infrastructure failure)."""
    return [
        r
        for r in rows
        if not r.get("retried")
        and str(r.get("policy_version") or "").partition(":")[0] in (*TRAINED_KINDS, "base")
        and r.get("termination") != "infra_error"
    ]


def draw(rows: list[Row], seed: int) -> list[str]:
    """One rollout at the earliest and one at the latest step of each split, drawn with `seed`."""
    rng = random.Random(seed)
    by_split: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_split[str(row["split"])][int(row["step"])].append(str(row["rollout_id"]))
    chosen: list[str] = []
    for split in sorted(by_split):
        steps = by_split[split]
        for step in sorted({min(steps), max(steps)}):
            chosen.append(rng.choice(sorted(steps[step])))
    return chosen


def versions_load(f: RunFacts, rows: list[Row], out: Finding) -> None:
    """Every trained version the rollouts name is kept, loads, and hashes to its name."""
    versions = sorted({str(r["policy_version"]) for r in rows if r.get("adapter_version") is None})
    trained = [v for v in versions if v.partition(":")[0] in TRAINED_KINDS]
    broken, unkept = 0, defaultdict(list)
    for version in trained:
        try:
            kept_tensors(f.record, version)
        except GoneError as exc:
            if exc.why is not None:
                unkept[exc.why].append(version)
                continue
            broken += 1
            if broken <= 3:
                out.fail(f"policy version {short(version.partition(':')[2])} cannot be opened: {exc}")
        except ReprorlError as exc:
            broken += 1
            if broken <= 3:
                out.fail(f"policy version {short(version.partition(':')[2])} cannot be opened: {exc}")
    for why, versions in sorted(unkept.items()):
        out.note(f"{len(versions)} of {len(trained)} policy versions {why}: their rollouts are not replayed")
    f.unkept_versions = {v for versions in unkept.values() for v in versions}
    trained = [v for v in trained if v not in f.unkept_versions]
    if trained and not broken:
        out.ok(
            f"{VERSIONS_FILE}: all {len(trained)} policy versions the rollouts name load and match their hash"
        )
    elif broken > 3:
        out.fail(f"... {broken - 3} more policy versions cannot be opened")


def replay_sample(f: RunFacts, out: Finding, seed: int) -> None:
    """Replay the drawn rollouts in recorded mode; each must match its record to the bit."""
    rows = _sampled(f.rollouts or [])
    if not rows:
        out.fail("no rollout sampled by a model to replay")
        return
    versions_load(f, rows, out)
    rows = [r for r in rows if r["policy_version"] not in f.unkept_versions]
    if not rows:
        out.note("no rollout was sampled from weights the run kept, so none is replayed")
        return
    chosen = draw(rows, seed)
    replayer = Replayer(f.store)

    async def replay_all() -> list[tuple[str, str | None]]:
        results: list[tuple[str, str | None]] = []
        for rollout_id in chosen:
            try:
                report = await replayer.replay(rollout_id, mode="recorded")
            except ReprorlError as exc:
                results.append((rollout_id, f"cannot be replayed: {exc}"))
                continue
            first = report.first
            results.append((rollout_id, None if first is None else f"differs at the {first.where}"))
        return results

    results = asyncio.run(replay_all())
    for rollout_id, problem in results:
        if problem is not None:
            out.fail(f"replay of {rollout_id}: {problem}")
    if all(problem is None for _, problem in results):
        out.ok(
            f"replayed {len(results)} rollouts drawn with seed {seed} (earliest and latest step of each "
            "split) in recorded mode: tokens and logprobs identical to the bit"
        )
