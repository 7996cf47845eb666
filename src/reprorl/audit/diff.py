"""Run diffs: every condition that differs between two runs, and how their eval metrics moved.

A *condition* is something a run was given before it started that can change its result: a spec
field, an artifact version (pinned in the spec, or recorded on the rollouts: env, tool and verifier
versions, the prompt template), noise settings, seeds, the code (commit, dirty diff, untracked
files), Python and package versions, and the hardware and sandbox it ran on. What a run produced
(metrics, adapters, policy versions, rollout seeds, run ids, timestamps) is never a condition;
neither are labels for people (the run name, owners) nor where things sat (hostname, interpreter
path, checkout folder, store root). A difference that necessarily follows from another listed one
(an env version when a tool version or an env setting changed, the prompt template when the base
model changed, the sampler's dtype when `model.sampling_dtype` changed) is kept apart as *derived*,
so each change is named once.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from reprorl.audit.suite_deltas import SuiteDelta, suite_deltas
from reprorl.errors import ReprorlError
from reprorl.hashing import sha256_hex
from reprorl.refs import RefError, parse_ref
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import TaskSet

GROUPS = ("spec", "artifacts", "noise", "seeds", "code", "packages", "hardware", "sandbox")
ENV_SETTINGS = ("data.tool_output_chars", "data.max_invalid_actions", "data.tool_permissions", "data.noise.")
# What makes each derived field differ: a field starting with one of these explains it.
EXPLAINED_BY: dict[str, tuple[str, ...]] = {
    "env.": ("tool.", *ENV_SETTINGS),
    "prompt_template": ("model.base", "model.chat_template"),
    "sampler.dtype": ("model.sampling_dtype",),
    "sampler.kind": ("model.inference",),
}
# Where the store and registry live says nothing about how a run behaved.
IGNORED_ENV_VARS = frozenset({"REPRORL_HOME", "REPRORL_DB_URL"})
SANDBOX_SECTIONS = ("limits", "isolation")
SAMPLER_KEYS = {"kind": "hardware", "dtype": "hardware", "threads": "hardware", "version": "code"}
MAX_SAMPLED_ROLLOUTS = 100
MAX_DETAIL_LINES = 40
MAX_COMPARED_LINES = 20_000
Labeller = Callable[[Any], Any]


@dataclass(frozen=True)
class Condition:
    """One field that differs: its group, its dotted name, and each run's value."""

    group: str
    field: str
    a: Any
    b: Any
    note: str = ""
    detail: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"group": self.group, "field": self.field, "a": self.a, "b": self.b}
        if self.note:
            out["note"] = self.note
        if self.detail:
            out["detail"] = list(self.detail)
        return out


@dataclass(frozen=True)
class RunDiff:
    """Everything that differs between run A and run B, and whether their metrics can be compared."""

    run_a: str
    run_b: str
    conditions: tuple[Condition, ...]
    derived: tuple[Condition, ...] = ()
    labels: tuple[Condition, ...] = ()
    metrics: tuple[SuiteDelta, ...] = field(default=())

    @property
    def comparable(self) -> bool:
        return bool(self.metrics) and all(m.comparable for m in self.metrics)

    @property
    def reasons(self) -> list[str]:
        """Why the metrics are not comparable (empty when they are)."""
        if not self.metrics:
            return ["neither run has an eval point"]
        return [f"{m.suite}: {m.reason}" for m in self.metrics if m.reason]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_a": self.run_a,
            "run_b": self.run_b,
            "conditions": [c.to_json() for c in self.conditions],
            "derived": [c.to_json() for c in self.derived],
            "labels": [c.to_json() for c in self.labels],
            "comparable": self.comparable,
            "not_comparable": self.reasons,
            "metrics": [m.to_json() for m in self.metrics],
        }


def diff_runs(store: Store, a: RunRecord, b: RunRecord) -> RunDiff:
    """Every condition that differs between runs `a` and `b`, and their eval metrics side by side."""
    facts_a, facts_b = _facts(store, a), _facts(store, b)
    differing: dict[str, tuple[str, Any, Any]] = {}
    for name in facts_a.keys() | facts_b.keys():
        (group_a, va), (group_b, vb) = facts_a.get(name, ("", None)), facts_b.get(name, ("", None))
        if va != vb:
            # One side's value decides the group when the other has none (an adapter vs no adapter).
            group = "artifacts" if "artifacts" in (group_a, group_b) else group_a or group_b
            differing[name] = (group, va, vb)
    label = _ref_labeller(store)
    conditions, derived, labels = [], [], []
    for name, (group, va, vb) in sorted(differing.items(), key=lambda i: (_order(i[1][0]), i[0])):
        condition = _render(group, name, va, vb, label)
        causes = [f for f in sorted(differing) if f != name and f.startswith(_explainers(name))]
        if group == "labels":
            labels.append(condition)
        elif causes:
            derived.append(_with_note(condition, "follows from " + ", ".join(causes)))
        else:
            conditions.append(condition)
    return RunDiff(
        a.run_id, b.run_id, tuple(conditions), tuple(derived), tuple(labels), suite_deltas(store, a, b)
    )


def _order(group: str) -> int:
    return GROUPS.index(group) if group in GROUPS else len(GROUPS)


# -- conditions --------------------------------------------------------------------------------


def _facts(store: Store, record: RunRecord) -> dict[str, tuple[str, Any]]:
    """Every condition of one run: field → (group, value); group `labels` holds the names for people."""
    spec, info = record.spec(), record.info()
    facts = {name: (_spec_group(name, value), value) for name, value in _flatten(spec).items()}
    for name, value in (info.get("seeds") or {}).items():
        if not (name == "root" and value == spec.get("seed")):  # the root seed is the spec's `seed`
            facts[f"seeds.{name}"] = ("seeds", value)
    environment = info.get("environment") or {}
    for where, state in sorted((environment.get("code") or {}).items()):
        state = state or {}
        for key in ("commit", "dirty", "untracked"):
            facts[f"code.{where}.{key}"] = ("code", state.get(key, [] if key == "untracked" else None))
        if state.get("dirty"):
            facts[f"code.{where}.diff"] = ("code", state.get("diff", ""))
    facts["python"] = ("packages", environment.get("python"))
    facts["platform"] = ("packages", environment.get("platform"))
    for package, version in (environment.get("packages") or {}).items():
        facts[f"packages.{package}"] = ("packages", version)
    cpu = environment.get("cpu") or {}
    facts["cpu.model"] = ("hardware", cpu.get("model"))
    facts["cpu.count"] = ("hardware", cpu.get("count"))
    facts["gpus"] = ("hardware", environment.get("gpus") or [])
    for var, value in (environment.get("env") or {}).items():
        if var not in IGNORED_ENV_VARS:
            facts[f"envvar.{var}"] = ("hardware", value)
    facts.update(_rollout_facts(record, _task_families(store, spec)))
    return facts


def _spec_group(name: str, value: Any) -> str:
    if name == "name" or name == "owner" or name.endswith(".owner"):
        return "labels"
    if name == "seed":
        return "seeds"
    if name.startswith("data.noise."):
        return "noise"
    return "artifacts" if _is_ref(value) else "spec"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested spec as dotted leaves; lists stay whole (adding a suite should not shift indices)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _is_ref(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and all(_is_ref(v) for v in value)
    if not isinstance(value, str):
        return False
    try:
        return parse_ref(value).is_pinned
    except RefError:
        return False


def _task_families(store: Store, spec: dict[str, Any]) -> dict[str, str]:
    """Task id → env family over the run's train set and eval suites (to name each env and verifier)."""
    refs = [spec.get("data", {}).get("train"), *spec.get("evaluation", {}).get("suites", [])]
    families: dict[str, str] = {}
    for ref in refs:
        try:
            tasks = TaskSet.from_jsonl(str(ref), store.read(str(ref)))
        except (ReprorlError, ValueError):
            continue  # an unreadable set only loses the family names, shown as '?'
        families.update({t.id: t.family for t in tasks.tasks})
    return families


def _rollout_facts(record: RunRecord, families: dict[str, str]) -> dict[str, tuple[str, Any]]:
    """Versions and settings recorded on the rollouts: env, tool, verifier, template, sampler, sandbox."""
    rollouts = RolloutStore(record)
    columns = ["step", "rollout_id", "task_id", "env_version", "tool_versions", "verifier_version"]
    rows = rollouts.query(columns=[*columns, "prompt_template_hash"]).to_pylist()
    seen: dict[tuple[str, str], set[Any]] = defaultdict(set)
    first_of_step: dict[int, str] = {}
    for row in rows:
        family = families.get(str(row["task_id"]), "?")
        first_of_step.setdefault(int(row["step"]), str(row["rollout_id"]))
        for name, value in (
            (f"env.{family}", row["env_version"]),
            (f"verifier.{family}", row["verifier_version"]),
            ("prompt_template", row["prompt_template_hash"]),
            *((f"tool.{tool}", version) for tool, version in row["tool_versions"] or []),
        ):
            if value:
                seen[("artifacts", name)].add(value)
    # Sampler and sandbox settings live in the full records; one rollout per step finds a change
    # made between steps (a resume elsewhere) without restoring every record.
    ids = list(first_of_step.values())
    if len(ids) > MAX_SAMPLED_ROLLOUTS:
        ids = [ids[i * len(ids) // MAX_SAMPLED_ROLLOUTS] for i in range(MAX_SAMPLED_ROLLOUTS)]
    if ids:
        where = "rollout_id IN (" + ", ".join("'" + i.replace("'", "''") + "'" for i in ids) + ")"
        for trajectory in rollouts.trajectories(where):
            for key, group in SAMPLER_KEYS.items():
                if trajectory.sampler.get(key) is not None:
                    seen[(group, f"sampler.{key}")].add(trajectory.sampler[key])
            for section in SANDBOX_SECTIONS:
                settings = trajectory.sandbox.get(section)
                for name, value in settings.items() if isinstance(settings, dict) else ():
                    seen[("sandbox", f"sandbox.{section}.{name}")].add(str(value))
    return {name: (group, _one_or_all(values)) for (group, name), values in seen.items()}


def _one_or_all(values: Iterable[Any]) -> Any:
    ordered = sorted(values, key=str)
    return ordered[0] if len(ordered) == 1 else ordered


def _explainers(name: str) -> tuple[str, ...]:
    """The fields whose change makes `name` change too (none for a field that stands on its own)."""
    if name.startswith("code.") and name.endswith(".diff"):
        return (name.removesuffix(".diff") + ".dirty",)  # a clean tree has no diff to compare
    return next((causes for prefix, causes in EXPLAINED_BY.items() if name.startswith(prefix)), ())


def _with_note(condition: Condition, note: str) -> Condition:
    return Condition(condition.group, condition.field, condition.a, condition.b, note, condition.detail)


def _render(group: str, name: str, a: Any, b: Any, labels: Labeller) -> Condition:
    """A differing field as people read it: artifact labels, summarised diffs, notes on what is not kept."""
    if group == "artifacts" and (_is_ref(a) or _is_ref(b)):
        return Condition(group, name, labels(a), labels(b))
    if name.endswith(".diff"):
        return _code_diff(group, name, a, b)
    if name.endswith(".dirty") and bool(a) != bool(b):
        return Condition(group, name, a, b, "the dirty side's diff is recorded; the clean side is its commit")
    if name.endswith(".untracked"):
        return Condition(group, name, a, b, "untracked files' contents are not recorded, only their names")
    return Condition(group, name, a, b)


def _code_diff(group: str, name: str, a: Any, b: Any) -> Condition:
    """Two dirty diffs summarised (hash, lines) with a short unified diff between them."""
    if a is None or b is None:  # only one side was dirty: its `dirty` flag already says so
        return Condition(group, name, _diff_summary(a), _diff_summary(b))
    if max(len(str(a).splitlines()), len(str(b).splitlines())) > MAX_COMPARED_LINES:
        # difflib's matching grows faster than linearly; a huge diff is named by its hash instead.
        return Condition(group, name, _diff_summary(a), _diff_summary(b), "both were dirty; too long to show")
    lines = list(
        difflib.unified_diff(
            str(a).splitlines(), str(b).splitlines(), "A's dirty diff", "B's dirty diff", lineterm="", n=1
        )
    )
    detail = lines[:MAX_DETAIL_LINES]
    if len(lines) > MAX_DETAIL_LINES:
        detail.append(f"… {len(lines) - MAX_DETAIL_LINES} more lines")
    return Condition(group, name, _diff_summary(a), _diff_summary(b), "both were dirty", tuple(detail))


def _diff_summary(diff: Any) -> str | None:
    if diff is None:
        return None
    text = str(diff)
    return f"sha256:{sha256_hex(text.encode())[:12]} ({len(text.splitlines())} lines)"


def _ref_labeller(store: Store) -> Labeller:
    """A function: pinned reference (or list of them) → `name@vN (sha256:<12 hex>)`."""
    cache: dict[str, str] = {}

    def one(ref: str) -> str:
        if ref not in cache:
            parsed = parse_ref(ref)
            short = f"sha256:{(parsed.digest or '')[:12]}"
            try:
                version = store.resolve(ref).version
            except ReprorlError:
                version = None
            if version is not None:
                cache[ref] = f"{version.label} ({short})"
            else:  # a recorded version (env, tool, verifier) is a hash, not a registered artifact
                cache[ref] = f"{parsed.name}@unregistered ({short})" if parsed.name else ref
        return cache[ref]

    def label(value: Any) -> Any:
        if isinstance(value, list):
            return [label(v) for v in value]
        return one(value) if isinstance(value, str) and _is_ref(value) else value

    return label
