"""Audit questions 1 to 5: what a run trained from and made: weights, data, rollouts, rewards, adapter.

Each check reads `RunFacts` and returns a `Finding`: the records that prove the answer, or what is
missing. A check fails on what its own records say; where a second record would only cross-check it
(rollouts, for the base model) and cannot be read, the check notes that and leaves the failure to the
question that owns that record.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from typing import Any

from reprorl.audit.facts import Finding, RunFacts, pinned_hash, short, succeeded, verify_artifact
from reprorl.config import LoraAdapter, RunSpec
from reprorl.config.judge import judge_id
from reprorl.errors import ReprorlError
from reprorl.orchestrate.run.judge_gate import OVERRIDE_EVENT, ROBUST_EVENT
from reprorl.policy.digest import tree_hash
from reprorl.types import Split

# Terminations the rollout loop never sends to a verifier (the platform failed, not the agent).
NOT_SCORED = frozenset({"infra_error", "sandbox_error"})


def base_model(f: RunFacts) -> Finding:
    """1. The exact base model and the weights RL started from (init adapter, SFT warm start)."""
    out = Finding()
    spec = f.need_spec(out)
    if spec is None:
        return out
    base = _pinned_input(f, out, "model.base", str(spec.model.base))
    if base is None:
        return out
    try:
        out.ok(f"base blob {short(base)} verifies: {verify_artifact(f.store, base, f.label(base))}")
    except ReprorlError as exc:
        out.fail(f"base model blob: {exc}")
    _starting_weights(f, out, spec, base)
    if f.rollouts is None:
        out.note("rollouts not cross-checked against the base (they cannot be read; see question 3)")
    else:
        other = Counter(r["base_model_hash"] for r in f.rollouts if r["base_model_hash"] != base)
        if other:
            found = ", ".join(f"{short(h)} ({n})" for h, n in other.most_common(3))
            out.fail(f"rollouts record another base_model_hash than model.base: {found}")
        elif f.rollouts:
            out.ok(f"all {len(f.rollouts)} rollouts record base_model_hash {short(base)}")
    return out


def _starting_weights(f: RunFacts, out: Finding, spec: RunSpec, base: str) -> None:
    init = spec.model.init_adapter
    if init is not None:
        address = _pinned_input(f, out, "model.init_adapter", str(init))
        if address is not None:
            try:
                verify_artifact(f.store, address, f.label(address))
                out.ok(f"init adapter blob {short(address)} verifies")
                recorded = f.store.resolve(address).version
                meta_base = recorded.meta.get("base_model") if recorded else None
                if meta_base not in (None, base):
                    out.fail(f"init adapter {f.label(address)} was trained on base {short(meta_base)}")
            except ReprorlError as exc:
                out.fail(f"init adapter: {exc}")
    if spec.learning.sft_steps:
        done = f.events_named("sft_done")
        if not done or not done[-1].get("adapter"):
            out.fail("no sft_done event with the warm-start adapter's hash in events.jsonl")
            return
        digest = str(done[-1]["adapter"])
        folder = f.path / "sft-adapter"
        if not folder.is_dir():
            out.fail(f"sft-adapter/ is missing (the sft_done event names {short(digest)})")
            return
        # Imported here: it loads torch, which only a run with a warm start makes worth paying for.
        from reprorl.policy.digest import tree_hash

        actual = tree_hash(folder)
        if actual != digest:
            out.fail(f"sft-adapter/ hashes to {short(actual)}, the sft_done event recorded {short(digest)}")
        else:
            out.ok(
                f"sft_done event: warm-start adapter {short(digest)} = sft-adapter/ "
                f"({spec.learning.sft_steps} steps)"
            )
        demonstrated = done[-1].get("demonstrated")  # absent in records older than the field
        wanted = spec.learning.sft_demonstrations
        count = len(set(demonstrated)) if isinstance(demonstrated, list) else None
        if count is not None and wanted is not None and count != wanted:
            out.fail(f"the warm start demonstrated {count} tasks; the spec asks for {wanted}")
        elif count is not None:
            out.ok(f"the warm start demonstrated {count} train tasks (named in sft_done)")
    elif init is None:
        kind = "LoRA adapter" if isinstance(spec.model.adapter, LoraAdapter) else "copy of every weight"
        out.ok(f"starting weights: the base plus a fresh {kind} initialised from seed {spec.seed}")


def data_versions(f: RunFacts) -> Finding:
    """2. The train task set pinned and intact; one env and tool version per family on every rollout."""
    out = Finding()
    spec = f.need_spec(out)
    if spec is None:
        return out
    train = _pinned_input(f, out, "data.train", str(spec.data.train))
    train_tasks: set[str] = set()
    if train is not None:
        try:
            taskset = f.taskset(train)
            train_tasks = {t.content_hash for t in taskset.split(Split.TRAIN)}
            if taskset.version != train:
                out.fail(f"task set {f.label(train)} reads back as version {short(taskset.version)}")
            else:
                out.ok(
                    f"task set blob {short(train)} verifies: {len(taskset.tasks)} tasks, "
                    f"{len(train_tasks)} train"
                )
        except (ReprorlError, ValueError) as exc:
            out.fail(f"train task set: {exc}")
    if f.rollouts is None:
        out.fail(
            f"env and tool versions are recorded only on rollouts, which cannot be read: {f.rollouts_error}"
        )
        return out
    families, complete = f.families
    if not complete:
        out.note("rollouts not matched to the task sets, which cannot all be read")
    foreign = [r for r in f.rollouts if complete and r["task_hash"] not in families]
    if train_tasks:
        foreign += [r for r in f.rollouts if r["split"] == "train" and r["task_hash"] not in train_tasks]
    if foreign:
        out.fail(
            f"{len({r['rollout_id'] for r in foreign})} rollouts ran tasks outside the pinned task sets "
            f"(e.g. {foreign[0]['task_id']} {short(foreign[0]['task_hash'])})"
        )
    by_family: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
    for r in f.rollouts:
        tools = json.dumps(r.get("tool_versions") or {}, sort_keys=True)
        by_family[f.family_of.get(r["task_hash"], "?")][(r["env_version"] or "", tools)] += 1
    for family, versions in sorted(by_family.items()):
        if len(versions) > 1:
            seen = "; ".join(
                f"env {short(e)} tools {_tools(t)} ({n})" for (e, t), n in versions.most_common(3)
            )
            out.fail(f"{family}: the environment changed within the run: {seen}")
            continue
        ((env, tools),) = versions
        if not env:
            out.fail(f"{family}: {versions.total()} rollouts record no env_version")
        else:
            out.ok(f"{family}: env {short(env)}, tools {_tools(tools)} on all {versions.total()} rollouts")
    return out


def rollouts(f: RunFacts) -> Finding:
    """3. Every rollout kept and readable, successes and failures, in the numbers the metrics counted."""
    out = Finding()
    if f.rollouts is None:
        out.fail(f"the rollout store cannot be read: {f.rollouts_error}")
        return out
    if not f.rollouts:
        out.fail("no rollouts are stored under rollouts/ and no rollouts_written event names any")
        return out
    out.ok(f"{len(f.rollouts)} rollouts in {f.rollout_parts} verified Parquet parts under rollouts/")
    for split in sorted({r["split"] for r in f.rollouts}):
        rows = [r for r in f.rollouts if r["split"] == split]
        good = sum(succeeded(r) for r in rows)
        ends = Counter(r["termination"] for r in rows if not succeeded(r))
        failed = ", ".join(f"{k} {n}" for k, n in ends.most_common()) or "none"
        out.ok(f"{split}: {good} successful, {len(rows) - good} failed ({failed})")
    # The step metrics counted every rollout as it was made: a stored count below them means
    # records (failed ones, typically) were dropped afterwards.
    stored: Counter[tuple[str, int, bool]] = Counter(
        ("train" if r["split"] == "train" else "held_out", int(r["step"]), bool(r["retried"]))
        for r in f.rollouts
    )
    expected: Counter[tuple[str, int, bool]] = Counter()
    for m in f.train_steps():
        expected["train", int(m["step"]), False] += int(m.get("rollouts", 0))
        expected["train", int(m["step"]), True] += int(m.get("infra_retries", 0))
    for m in f.eval_points():
        for key, value in m.items():
            if key.startswith("eval/") and key.endswith("/rollouts") and key.count("/") == 2:
                expected["held_out", int(m["step"]), False] += int(value)
    gaps = [(k, n, stored[k]) for k, n in sorted(expected.items()) if stored[k] != n]
    for (split, step, retried), want, have in gaps[:3]:
        what = "retried infra attempts" if retried else f"{split.replace('_', '-')} rollouts"
        out.fail(f"step {step}: metrics.jsonl counted {want} {what}, the rollout store holds {have}")
    if expected and not gaps:
        out.ok(
            f"counts match metrics.jsonl at every step ({sum(expected.values())} rollouts, retries included)"
        )
    return out


def reward_config(f: RunFacts) -> Finding:
    """4. Loss settings and reward weights in the spec; every stored reward recomputed from them."""
    out = Finding()
    spec = f.need_spec(out)
    if spec is None:
        return out
    learn = spec.learning
    kl = "off" if learn.kl.estimator == "off" else f"{learn.kl.estimator} x {learn.kl.coef:g}"
    out.ok(
        f"spec.json learning: loss {_loss_text(learn.loss.model_dump(mode='json'))}, "
        f"advantage {learn.advantage}, lr {learn.lr:g} ({learn.schedule}), "
        f"tis_cap {learn.tis_cap:g}, KL {kl}, group {learn.group_size}"
    )
    weights = spec.data.reward_weights
    out.ok(f"spec.json data.reward_weights: {', '.join(f'{k} {v:g}' for k, v in sorted(weights.items()))}")
    if spec.data.judge is not None:
        judge_gate(out, f, judge_id(spec.data.judge))
    if f.rollouts is None:
        out.fail(f"verifier versions are recorded only on rollouts, which cannot be read: {f.rollouts_error}")
        return out
    scored = [r for r in f.rollouts if r["reward_total"] is not None]
    unscored = [r for r in f.rollouts if r["reward_total"] is None]
    # Episodes the platform failed are not scored by design; any other episode without a reward
    # had its verifier or judge fail. Such a rollout must have been left out of training and of the
    # figures (each step's `unscored` counts it); a run from before that rule trained on it as 0.
    unjudged = [r for r in unscored if r["termination"] not in NOT_SCORED and not r["retried"]]
    if unjudged:
        reasons = Counter(r["error"] or "no error recorded" for r in unjudged)
        why = "; ".join(f"{why!r} x{n}" for why, n in reasons.most_common(2))
        counted = {int(m["step"]): m.get("unscored") for m in f.train_steps()}
        train_steps = Counter(int(r["step"]) for r in unjudged if r["split"] == Split.TRAIN.value)
        uncounted = sorted(s for s, n in train_steps.items() if s in counted and (counted[s] or 0) < n)
        if uncounted:
            out.fail(
                f"{len(unjudged)} rollouts that ran to an end carry no reward ({why}), and the metrics "
                f"of step {uncounted[0]} do not count them as unscored: they were trained on as reward 0"
            )
        else:
            out.note(
                f"{len(unjudged)} rollouts are unscored ({why}): left out of training and figures, counted"
            )
    if len(unscored) > len(unjudged):
        out.note(f"{len(unscored) - len(unjudged)} infra or sandbox failures are unscored, as designed")
    if not scored:
        out.fail("no rollout carries a reward from a versioned verifier")
        return out
    anonymous = [r for r in scored if not r["verifier_version"]]
    if anonymous:
        out.fail(f"{len(anonymous)} rewards name no verifier version (e.g. {anonymous[0]['rollout_id']})")
    off = [(r, _weighted(r, weights)) for r in scored]
    off = [
        (r, w) for r, w in off if not math.isclose(float(r["reward_total"]), w, rel_tol=1e-9, abs_tol=1e-9)
    ]
    if off:
        r, w = off[0]
        out.fail(
            f"{len(off)} stored reward(s) are not data.reward_weights x components "
            f"(e.g. {r['rollout_id']}: total {r['reward_total']:g}, the weights give {w:g})"
        )
    verifiers: dict[str, Counter[str]] = defaultdict(Counter)
    for r in scored:
        verifiers[f.family_of.get(r["task_hash"], "?")][r["verifier_version"] or ""] += 1
    for family, versions in sorted(verifiers.items()):
        listed = ", ".join(f"{short(v)} ({n})" for v, n in versions.most_common(3))
        if len(versions) > 1:
            out.fail(f"{family}: the verifier changed within the run: {listed}")
        elif not anonymous and not off:
            out.ok(f"{family}: {versions.total()} rewards = weights x components of verifier {listed}")
    produced = {c for r in scored for c in r["reward_components"] or {}}
    unused = sorted(set(weights) - produced)
    if unused:
        out.note(f"data.reward_weights names components no verifier produced: {', '.join(unused)}")
    return out


def judge_gate(out: Finding, f: RunFacts, judge: str) -> None:
    """A judge that scored rewards passed its robustness audit, or was used on a recorded override."""
    gates = [e for e in f.events_named(ROBUST_EVENT, OVERRIDE_EVENT) if e.get("judge") == judge]
    if not gates:
        out.fail(f"data.judge {judge} scored the rewards, but no robustness gate is recorded for it")
        return
    gate = gates[-1]
    rate = gate.get("fooled_rate")
    audit = f"{gate.get('audit') or 'no audit'}" + ("" if rate is None else f", fooled rate {rate:.1%}")
    if gate["event"] == OVERRIDE_EVENT:
        out.note(f"data.judge {judge} was used on an override ({audit}): {gate.get('reason')!r}")
    else:
        out.ok(f"data.judge {judge}: let through by its robustness audit ({audit})")


def adapter_lineage(f: RunFacts) -> Finding:
    """5. The trained weights registered with the run's base, adapter settings, LR, loss and data."""
    out = Finding()
    spec = f.need_spec(out)
    if spec is None:
        return out
    saved = [e for e in f.events_named("adapter_saved") if e.get("artifact") and e.get("adapter")]
    if not saved:
        status = (f.status or {}).get("status", "unknown")
        out.fail(
            f"no adapter_saved event in events.jsonl: no trained weights were registered (status {status})"
        )
        return out
    event = saved[-1]
    label, digest = str(event["artifact"]), str(event["adapter"])
    try:
        version = f.store.resolve(label).version
    except ReprorlError as exc:
        out.fail(f"adapter_saved names {label}, which the registry cannot find: {exc}")
        return out
    if version is None or version.hash != digest:
        out.fail(
            f"registry {label} is {short(version.hash if version else None)}, "
            f"adapter_saved says {short(digest)}"
        )
        return out
    out.ok(f"adapter_saved event: {label} = {short(digest)}")
    base = f.inputs.get("model.base", "")
    expected: dict[str, Any] = {
        "base_model": base,
        "adapter": spec.model.adapter.model_dump(mode="json"),
        "lr": spec.learning.lr,
        "loss": spec.learning.loss.kind,
        "train_taskset": f.inputs.get("data.train"),
        "step": event.get("step", spec.learning.steps),
        "run_id": f.run_id,
        "spec_hash": (f.info or {}).get("spec_hash"),
    }
    wrong = [k for k, v in expected.items() if version.meta.get(k) != v]
    for key in wrong:
        got = version.meta.get(key, "missing")
        out.fail(f"registry meta of {label}: {key} is {got!r}, the run's record says {expected[key]!r}")
    if not wrong:
        out.ok(f"registry meta of {label}: {', '.join(expected)} all match the run's spec and record")
    edges = f.store.registry.parents(version.hash)
    if (base, "adapter_of", f.run_id) in edges:
        out.ok(f"lineage: {label} adapter_of {f.label(base)} (run {f.run_id})")
    else:
        out.fail(f"no adapter_of lineage edge from {label} to the base {short(base)} for this run")
    try:
        out.ok(f"adapter blob {short(digest)} verifies: {verify_artifact(f.store, digest, label)}")
        if isinstance(spec.model.adapter, LoraAdapter):
            recorded = _adapter_config(f, digest).get("base_model_name_or_path")
            if recorded != base:
                out.fail(f"{label}/adapter_config.json names base {recorded!r}, not {short(base)}")
    except (ReprorlError, ValueError, KeyError) as exc:
        out.fail(f"adapter blob: {exc}")
    _adapter_folder(f, out, digest)
    return out


def _adapter_folder(f: RunFacts, out: Finding, digest: str) -> None:
    """The folder users are told to load (`runs/<id>/adapter/`) holds exactly the registered weights."""
    folder = f.path / "adapter"
    if not folder.is_dir():
        out.fail(f"runs/{f.run_id}/adapter/ is missing: the trained weights can be had only from the store")
        return
    try:
        found = tree_hash(folder)
    except OSError as exc:
        out.fail(f"runs/{f.run_id}/adapter/ cannot be read: {exc}")
        return
    if found != digest:
        out.fail(
            f"runs/{f.run_id}/adapter/ hashes to {short(found)}, not the registered {short(digest)}: "
            f"its files were changed after the run (`reprorl artifacts export` gives the registered ones)"
        )
    else:
        out.ok(f"runs/{f.run_id}/adapter/ hashes to the registered {short(digest)}")


def _pinned_input(f: RunFacts, out: Finding, field: str, ref: str) -> str | None:
    """The hash `field` is pinned to, if run.json's inputs record the same; else the failure."""
    address = pinned_hash(ref)
    if address is None:
        out.fail(f"spec.json {field} = {ref!r} is not pinned to a full content hash")
        return None
    recorded = f.inputs.get(field)
    if recorded != address:
        out.fail(f"run.json inputs[{field!r}] is {short(recorded)}, spec.json pins {short(address)}")
        return None
    out.ok(f"spec.json {field} = {f.label(address)}, pinned to {short(address)} (run.json inputs agree)")
    return address


def _adapter_config(f: RunFacts, address: str) -> dict[str, Any]:
    entries = f.store.blobs.read_tree(address)["entries"]
    (entry,) = [e for e in entries if e["path"] == "adapter_config.json"]
    config: dict[str, Any] = json.loads(f.store.blobs.get_bytes(entry["hash"]))
    return config


def _weighted(row: dict[str, Any], weights: dict[str, float]) -> float:
    components: dict[str, float] = row["reward_components"] or {}
    return sum(weights.get(name, 0.0) * value for name, value in components.items())


def _tools(encoded: str) -> str:
    tools: dict[str, str] = json.loads(encoded)
    return ", ".join(f"{k} {short(v)}" for k, v in sorted(tools.items())) or "none"


def _loss_text(table: dict[str, Any]) -> str:
    """`ppo_clip (clip_low 0.2, clip_high 0.28)`: the loss and its own settings."""
    rest = ", ".join(
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in table.items() if k != "kind"
    )
    return f"{table['kind']} ({rest})" if rest else str(table["kind"])
