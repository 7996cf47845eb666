"""Audit questions 6 to 9: the eval set (separate, stable), what the run cost, whether it can be recreated.

Like `checks`, each check reads `RunFacts` and returns a `Finding` with the records that prove the
answer or what is missing. Question 9 also owns record integrity: the checksums of `run.json` and
`spec.json` and the line checksums of `metrics.jsonl` and `events.jsonl`.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from reprorl.audit.facts import (
    Finding,
    RunFacts,
    held_out,
    missing_objects,
    pinned_hash,
    short,
    verify_artifact,
)
from reprorl.audit.replayable import replay_sample
from reprorl.config import iter_refs
from reprorl.config.limits import dotted
from reprorl.errors import ReprorlError
from reprorl.evaluation.leakage import check_leakage
from reprorl.hashing import content_hash
from reprorl.refs import parse_ref
from reprorl.store import iter_runs
from reprorl.types import Split

GIT_TIMEOUT_S = 10.0

# Untracked files with these endings (or whole untracked folders) may be code the run imported;
# git's diff never holds them, so their content is not in the record.
SOURCE_SUFFIXES = (".py", ".pyx", ".pxd", ".c", ".cc", ".cpp", ".h", ".so", ".jinja", ".j2")
STEP_KEYS = (
    "rollouts",
    "rollout_s",
    "rollout_cpu_s",
    "train_s",
    "train_cpu_s",
    "cpu_s",
    "completion_tokens",
    "cost_usd",
)
REQUIRED_PACKAGES = ("reprorl", "torch")


def eval_separation(f: RunFacts) -> Finding:
    """6. The leakage gate ran before training, found no overlap, and agrees with a re-check."""
    out = Finding()
    spec = f.need_spec(out)
    if spec is None:
        return out
    events = f.events_named("leakage_check", "leakage_allowed")
    if not events:
        out.fail(
            "no leakage_check event in events.jsonl: nothing shows the eval tasks were compared with train"
        )
        return out
    event = events[-1]
    if event["event"] == "leakage_allowed" or not event.get("ok"):
        out.fail(
            f"{event['event']} event (evaluation.allow_leakage = true): "
            f"{event.get('summary', 'overlap found')}"
        )
    else:
        out.ok(f"leakage_check event: {event.get('summary', 'ok')}")
    suites = {str(s) for s in spec.evaluation.suites}
    covered = set(event.get("held_out_counts") or {})
    if covered != suites:
        out.fail(f"the leakage check covered {sorted(covered)}, the spec's suites are {sorted(suites)}")
    try:
        train = f.taskset(f.inputs["data.train"]).split(Split.TRAIN)
        held = {
            str(ref): held_out(f.taskset(f.inputs[f"evaluation.suites[{i}]"]))
            for i, ref in enumerate(spec.evaluation.suites)
        }
        report = check_leakage(train, held, threshold=float(event["threshold"]), n=int(event["n"]))
    except (ReprorlError, ValueError, KeyError) as exc:
        out.note(f"not re-checked on the stored task sets: {exc}")
        return out
    if report.ok != bool(event.get("ok")) or len(report.leaks) != event.get("leak_count"):
        out.fail(f"re-checked on the stored task sets: {report.summary()} — the event says otherwise")
    elif report.ok:
        out.ok(f"re-checked on the stored task sets: no leak among {report.train_count} train tasks")
    return out


def eval_stability(f: RunFacts) -> Finding:
    """7. Suites pinned by hash and intact; every eval point measured the pinned version, whole."""
    out = Finding()
    spec = f.need_spec(out)
    if spec is None:
        return out
    pinned: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for i, ref in enumerate(spec.evaluation.suites):
        address = pinned_hash(str(ref))
        if address is None or f.inputs.get(f"evaluation.suites[{i}]") != address:
            out.fail(
                f"spec.json evaluation.suites[{i}] = {str(ref)!r} is not pinned as run.json inputs record"
            )
            continue
        pinned[str(ref)] = address
        try:
            size = sizes[str(ref)] = len(held_out(f.taskset(address)))
            verify_artifact(f.store, address, f.label(address))
            out.ok(
                f"suite {f.label(address)} pinned to {short(address)}, blob verifies: {size} held-out tasks"
            )
        except (ReprorlError, ValueError) as exc:
            out.fail(f"eval suite: {exc}")
    points = f.eval_points()
    if not points:
        out.fail("metrics.jsonl holds no eval point (lines with stage = 'eval')")
        return out
    steps: dict[str, list[int]] = defaultdict(list)
    for m in points:
        suite, step = str(m.get("suite", "")), int(m["step"])
        if suite not in pinned:
            out.fail(
                f"the eval point at step {step} names suite {suite or '(none)'}, not a pinned spec suite"
            )
            continue
        if not m.get("policy_version"):
            out.fail(f"the eval point at step {step} does not name the weights it measured (policy_version)")
        name = parse_ref(suite).name
        tasks = m.get(f"eval/{name}/tasks")
        if tasks is not None and sizes.get(suite, int(tasks)) != int(tasks):
            out.fail(
                f"the eval point at step {step} measured {int(tasks)} tasks of {name}, not {sizes[suite]}"
            )
        steps[suite].append(step)
    final = spec.learning.steps if (f.status or {}).get("status") == "succeeded" else None
    for suite in pinned:
        seen = sorted(steps.get(suite, []))
        if not seen or seen[0] != 0 or (final is not None and seen[-1] != final):
            out.fail(
                f"suite {parse_ref(suite).name}: eval points at steps {seen}, expected 0 through {final}"
            )
        else:
            out.ok(
                f"{len(seen)} eval points (steps {', '.join(map(str, seen))}) all name {short(pinned[suite])}"
            )
    _other_versions(f, pinned, out)
    return out


def _other_versions(f: RunFacts, pinned: dict[str, str], out: Finding) -> None:
    """Note other runs that measured a suite of the same name at another version: not comparable."""
    names = {parse_ref(ref).name: address for ref, address in pinned.items()}
    others: dict[str, set[str]] = defaultdict(set)
    for run_id in iter_runs(f.store):
        if run_id == f.run_id:
            continue
        try:
            suites = json.loads((f.store.runs_dir / run_id / "spec.json").read_bytes())["evaluation"][
                "suites"
            ]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for ref in suites:
            name, address = parse_ref(ref).name, pinned_hash(ref)
            if name in names and address is not None and address != names[name]:
                others[f"{name}@{short(address)}"].add(run_id)
    for version, runs in sorted(others.items()):
        out.note(
            f"{len(runs)} other run(s) measured {version}, another version: not comparable (e.g. {min(runs)})"
        )


def cost(f: RunFacts) -> Finding:
    """8. Wall and CPU time, rollout volume, tokens and priced cost, per step and per eval point."""
    out = Finding()
    spec = f.need_spec(out)
    if spec is None:
        return out
    steps = f.train_steps()
    if not steps:
        out.fail("metrics.jsonl holds no training step line")
        return out
    for m in steps:
        absent = [k for k in STEP_KEYS if not isinstance(m.get(k), int | float)]
        if absent:
            out.fail(f"metrics.jsonl step {m['step']}: no {', '.join(absent)}")
    if (f.status or {}).get("status") == "succeeded":
        lost = sorted(set(range(spec.learning.steps)) - {int(m["step"]) for m in steps})
        if lost:
            out.fail(f"metrics.jsonl has no line for training step(s) {', '.join(map(str, lost[:5]))}")
    points = f.eval_points()
    for m in points:
        absent = [k for k in ("eval_s", "eval_cpu_s") if k not in m]
        if absent:
            out.fail(f"metrics.jsonl eval point at step {m['step']}: no {', '.join(absent)}")
    if out.missing:
        return out

    def total(key: str, lines: list[dict[str, Any]]) -> float:
        return sum(float(m.get(key, 0.0)) for m in lines)

    sft = sum(float(e.get("seconds", 0.0)) for e in f.events_named("sft_done"))
    out.ok(
        f"time: rollouts {total('rollout_s', steps):.1f} s wall / {total('rollout_cpu_s', steps):.1f} s CPU, "
        f"updates {total('train_s', steps):.1f} s / {total('train_cpu_s', steps):.1f} s, "
        f"eval {total('eval_s', points):.1f} s, SFT {sft:.1f} s (metrics.jsonl, sft_done event)"
    )
    held = sum(
        float(v) for m in points for k, v in m.items() if k.count("/") == 2 and k.endswith("/rollouts")
    )
    out.ok(
        f"volume: {total('rollouts', steps):.0f} train rollouts in {len(steps)} steps "
        f"(+{total('infra_retries', steps):.0f} infra retries), "
        f"{held:.0f} eval rollouts at {len(points)} points"
    )
    out.ok(
        f"tokens: {total('completion_tokens', steps):,.0f} sampled in training, "
        f"{total('train/tokens', steps):,.0f} trained on"
    )
    eval_cost = sum(
        float(v) for m in points for k, v in m.items() if k.count("/") == 2 and k.endswith("/cost_usd")
    )
    out.ok(
        f"compute: {total('cpu_s', steps):.1f} rollout CPU s; cost ${total('cost_usd', steps):.4f} training "
        f"+ ${eval_cost:.4f} eval at budget.prices"
    )
    if not any(spec.budget.prices.model_dump().values()):
        out.note("budget.prices are all 0, so every cost_usd is 0: CPU seconds are the compute figure")
    return out


def recreate(f: RunFacts) -> Finding:
    """9. Intact records, a pinned spec with every input stored, the code, packages and seeds recorded;
    a seeded sample of the rollouts replays and every policy version they name loads."""
    out = Finding()
    _integrity(f, out)
    info, spec = f.info or {}, f.need_spec(out)
    if spec is not None:
        refs = {dotted(path): pinned_hash(str(ref)) for path, ref in iter_refs(spec)}
        unpinned = sorted(k for k, v in refs.items() if v is None)
        if unpinned:
            out.fail(f"spec.json references not pinned to a content hash: {', '.join(unpinned)}")
        elif refs != f.inputs:
            out.fail(f"run.json inputs {sorted(f.inputs)} do not match the spec's references {sorted(refs)}")
        else:
            out.ok(f"spec.json validates and pins all {len(refs)} references; run.json inputs agree")
        absent = {k: missing_objects(f.store, v) for k, v in f.inputs.items()}
        absent = {k: v for k, v in absent.items() if v}
        for field, objects in sorted(absent.items()):
            out.fail(
                f"input {field} ({f.label(f.inputs[field])}): "
                f"{len(objects)} object(s) missing from the blob store"
            )
        if not absent:
            out.ok(f"every input's objects are in the blob store ({len(f.inputs)} artifacts)")
        seeds = info.get("seeds") or {}
        if seeds.get("root") != spec.seed:
            out.fail(f"run.json seeds.root is {seeds.get('root')!r}, spec.json seed is {spec.seed}")
        else:
            out.ok(f"run.json seeds: root {spec.seed} (every other seed derives from it)")
        if spec.model.inference is not None:
            out.note(
                f"sampled through {spec.model.inference.url}: its batches are not recorded, "
                "so no bit-exact replay"
            )
        elif f.rollouts is not None:
            if spec.model.vllm is not None:
                out.note(
                    "sampled by vLLM, which does not report its batches: the replay takes each "
                    "rollout's tokens from the record and checks tools, verifier and reward"
                )
            replay_sample(f, out, spec.seed)
    env = info.get("environment")
    if not isinstance(env, dict):
        out.fail("run.json records no environment (code, packages, hardware)")
        return out
    _code(env, out)
    packages = env.get("packages") or {}
    lacking = [p for p in REQUIRED_PACKAGES if p not in packages]
    if not packages:
        out.fail("run.json environment.packages is missing or empty: no package versions are recorded")
    elif lacking:
        out.fail(f"run.json environment.packages lacks {', '.join(lacking)}")
    else:
        out.ok(
            f"environment.packages: {len(packages)} versions "
            f"(torch {packages['torch']}, reprorl {packages['reprorl']})"
        )
    if not env.get("python"):
        out.fail("run.json environment.python is not recorded")
    cpu = env.get("cpu") or {}
    out.note(
        f"recorded on {cpu.get('model', '?')} x{cpu.get('count', '?')}, GPUs {env.get('gpus') or 'none'}"
    )
    return out


def _integrity(f: RunFacts, out: Finding) -> None:
    try:
        f.record.verify()
        out.ok("checksums.json: run.json and spec.json match the checksums written at creation")
    except ReprorlError as exc:
        out.fail(str(exc))
    if f.info is not None and f.spec_doc is not None and content_hash(f.spec_doc) != f.info.get("spec_hash"):
        out.fail(f"spec.json no longer hashes to the recorded spec_hash {short(f.info.get('spec_hash'))}")
    for name, log in (("metrics.jsonl", f.metrics), ("events.jsonl", f.events)):
        if log.bad_lines:
            out.fail(f"{name}: line(s) {', '.join(map(str, log.bad_lines[:5]))} torn or altered (checksum)")
    if f.status is None or f.status.get("from_event"):
        out.note("status.json is missing: the run's status is taken from its last status event")
    if f.store.has_registry() and f.store.registry.has_run(f.run_id):
        indexed = f.store.registry.run_artifacts(f.run_id)
        if indexed != f.inputs:
            out.fail("the registry's run index lists other inputs than run.json")


def _code(env: dict[str, Any], out: Finding) -> None:
    states = {k: v for k, v in (env.get("code") or {}).items() if isinstance(v, dict)}
    if not states:
        version = (env.get("packages") or {}).get("reprorl")
        if version:
            out.ok(f"no git checkout recorded: the code is the installed package reprorl {version}")
        else:
            out.fail("run.json environment.code records no git commit")
        return
    for where, state in sorted(states.items()):
        at = f"environment.code.{where} ({state.get('root', '?')})"
        commit, untracked = state.get("commit"), list(state.get("untracked") or [])
        source = [u for u in untracked if u.endswith("/") or u.endswith(SOURCE_SUFFIXES)]
        if commit:
            _commit_exists(at, str(state.get("root", "")), str(commit), out)
        if not commit:
            out.fail(f"{at}: no commit recorded")
        elif not state.get("dirty"):
            out.ok(f"{at}: commit {commit[:12]}, clean")
        elif state.get("diff_truncated"):
            out.fail(f"{at}: commit {commit[:12]} with a diff cut at its size limit; commit the changes")
        elif state.get("diff"):
            out.ok(f"{at}: commit {commit[:12]} + the recorded diff ({len(state['diff']):,} bytes)")
        elif not untracked:
            out.fail(f"{at}: commit {commit[:12]} marked dirty, but no diff is recorded")
        if source:
            more = f" and {len(source) - 3} more" if len(source) > 3 else ""
            out.fail(f"{at}: untracked code not in the record: {', '.join(source[:3])}{more}; commit it")
        if len(untracked) > len(source):
            out.note(f"{at}: {len(untracked) - len(source)} untracked non-code file(s) not recorded")


def _commit_exists(at: str, root: str, commit: str, out: Finding) -> None:
    """Where the recorded repository is at hand, the recorded commit must be in it."""
    if not root or not (Path(root) / ".git").exists():
        out.note(f"{at}: the repository is not at hand here, so commit {commit[:12]} was not looked up")
        return
    try:
        found = subprocess.run(
            ["git", "-C", root, "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        out.note(f"{at}: could not ask git about commit {commit[:12]}: {exc}")
        return
    if found.returncode != 0:
        out.fail(f"{at}: commit {commit[:12]} is not in the repository at {root}")
    else:
        out.ok(f"{at}: commit {commit[:12]} exists in the repository")
