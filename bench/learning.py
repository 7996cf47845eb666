"""Learning check on the real model: held-out success before and after RL, per family and seed, with 95%
CIs, and (`--control sft`) against an SFT-only run given the same compute.

Per family and seed, in one scratch store: the family's recipe (`--recipe`, by default
`configs/<family>.toml`, `calculator.toml` for calc: SmolLM2-135M-Instruct, LoRA, an SFT warm start
on oracle demonstrations, then RL) with that seed, evaluated on a held-out suite (the family's eval and
holdout splits, never trained on) at the step-0 eval point (after the warm start, before any RL) and
after the last step. `mixed` is one run over calc + sql + files (`configs/mixed.toml`: a merged train
set, each step drawing every family its weighted share), measured on each family's held-out suite.

It prints per run and suite: success before and after (bootstrap 95% interval over tasks), the paired
change with its interval and p-value, whether the two intervals overlap, and the CPU and wall minutes
of the RL phase (rollouts + updates; eval points excluded), and under each RL run its median update
(forward, backward, optimizer step) against its FLOP bound (`train/model_flops` over this machine's
matmul rate in the updates' dtype, measured in this sitting). With `--control sft`, each RL run gets a
control run of the same spec with no RL step (`learning.steps = 0`) and as many more SFT steps as
take the RL phase's CPU time at the warm start's measured CPU seconds per SFT step (`--sft-step-cpu-s`
where the RL run started from a stored warm start, `model.init_adapter`, and made none); the table adds
the control's held-out success, its CPU minutes, and RL's paired margin over it (per task, p-value by
sign flips), and a last line per family pools the margin over the seeds (pairs are seed x task).
Run it alone: torch processes sharing two cores with two threads each wait on each other. With
`--keep DIR`, a run whose exact spec already succeeded in DIR is read back instead of trained again.
Every measured run is also appended to a ledger (`--ledger`, by default `bench/results/learning.jsonl`,
kept in the repository): one line per run with its spec hash and recipe key (the hash of the fields
set to other than their defaults, which a new spec field leaves alone), the commit and date it was
measured at, its per-task held-out success and its CPU minutes. A run whose spec hash or recipe key
the ledger holds is read from there instead of trained, so a table is built over several sittings
(one seed or family at a time) and the pooled line covers them all; each row names the commit that
measured it.
`--no-train` prints only what the ledger holds. `--train N` trains on N tasks per family drawn by the
family's generator (the shipped set is its first 64) instead of the shipped set: with
`learning.sft_demonstrations` the warm start (and the SFT control) sees a few demonstrated tasks while
RL practises on every task, only a verifier to tell it how it did.

    .venv/bin/python bench/learning.py [--families calc sql files mixed] [--seeds 0 1 2] [--control sft]
        [--steps N] [--lr LR] [--heldout 128] [--train N] [--recipe FILE] [--set FIELD=VALUE ...] [--keep DIR]
        [--ledger FILE] [--no-train]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import tempfile
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch
from sampling import matmul_flops

from reprorl.config import RunSpec, load_spec, resolve_spec
from reprorl.config.load import stored_spec
from reprorl.envs.families import calculator, files, sql
from reprorl.evaluation import intervals_overlap
from reprorl.evaluation.metrics import task_interval
from reprorl.evaluation.stats import Estimate, PairedDifference, paired_difference
from reprorl.hashing import content_hash, derive_seed
from reprorl.orchestrate.jobs.train import train_run
from reprorl.orchestrate.run.outcome import suite_points
from reprorl.policy.gguf import bundled_gguf
from reprorl.store import RunRecord, Store, iter_runs
from reprorl.types import Split, TaskSet

GENERATORS = {"calc": calculator, "sql": sql, "files": files}
ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
LEDGER = ROOT / "bench" / "results" / "learning.jsonl"
MIXED = ("calc", "sql", "files")


@dataclass(frozen=True)
class Measured:
    """One run's held-out success per suite at its first and last eval points, and its compute."""

    spec_hash: str
    run_id: str
    commit: str  # the code that trained it, from its record ("+dirty" when the checkout had changes)
    date: str
    first: dict[str, dict[str, float]]  # suite -> task -> success
    last: dict[str, dict[str, float]]
    cpu_min: float  # RL phase: rollouts + updates
    wall_min: float
    sft_cpu_min: float  # the warm start
    sft_step_cpu_s: float  # its median CPU seconds per step
    # The RL updates' median wall seconds (forward, backward, optimizer) and FLOP bound, and the dtype
    # of their matmuls; None in lines measured before the runs recorded them.
    update_s: float | None = None
    update_flops: float | None = None
    compute_dtype: str | None = None
    matmul_rate: float | None = None  # FLOP/s in compute_dtype, measured by the trainer as it started
    # The spec's fields that differ from their defaults, hashed (`recipe_key`): unlike the spec hash,
    # which covers every default, it survives a new spec field whose default changes nothing.
    recipe: str | None = None


def code_state(record: RunRecord) -> str:
    """The commit the run was trained at, as its record has it ("+dirty" with uncommitted changes)."""
    code = record.info().get("environment", {}).get("code", {})
    state = code.get("reprorl") or code.get("cwd") or {}
    commit = str(state.get("commit") or "unknown")[:12]
    return commit + ("+dirty" if state.get("dirty") else "")


def recipe_key(spec: RunSpec) -> str:
    """The hash of what `spec` sets to other than its defaults."""
    return content_hash(spec.model_dump(mode="json", exclude_defaults=True))


def read_ledger(path: Path) -> dict[str, Measured]:
    """Spec hash and recipe key -> the run measured with it (the latest line wins)."""
    if not path.exists():
        return {}
    runs = [Measured(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return {key: m for m in runs for key in (m.spec_hash, m.recipe) if key is not None}


def append_ledger(path: Path, measured: Measured) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(asdict(measured), sort_keys=True) + "\n")


def register(store: Store, family: str, heldout: int, train: int | None = None) -> list[str]:
    """The train split as shipped (or, with `train`, that many drawn by the family's generator, the
    shipped ones first) and a held-out suite (eval + holdout splits, `heldout` tasks); `mixed` merges
    the three train sets into `mixed-train`. Returns the held-out suites' names."""
    store.add("smollm2-135m-instruct", bundled_gguf(), kind="model")
    parts = MIXED if family == "mixed" else (family,)
    trains: list[TaskSet] = []
    for part in parts:
        if train is None:
            with resources.as_file(resources.files("reprorl") / "examples" / f"{part}-train.jsonl") as path:
                trains.append(TaskSet.from_jsonl(f"{part}-train", path.read_bytes()))
        else:
            trains.append(GENERATORS[part].generate(0, train=train, eval=0, holdout=0)[Split.TRAIN])
        sets = GENERATORS[part].generate(0, eval=heldout // 2, holdout=heldout - heldout // 2)
        tasks = sets[Split.EVAL].tasks + sets[Split.HOLDOUT].tasks
        store.add_bytes(
            f"{part}-heldout", TaskSet(name=f"{part}-heldout", tasks=tasks).to_jsonl(), kind="taskset"
        )
    merged = TaskSet(name=f"{family}-train", tasks=tuple(t for s in trains for t in s.tasks))
    store.add_bytes(f"{family}-train", merged.to_jsonl(), kind="taskset")
    return [f"{part}-heldout" for part in parts]


def recipe(family: str, given: Path | None) -> Path:
    if given is not None:
        return given
    return CONFIGS / ("calculator.toml" if family == "calc" else f"{family}.toml")


def rl_minutes(record: RunRecord) -> tuple[float, float]:
    steps = [m for m in record.metrics().records if m.get("stage") is None]
    cpu = sum(m["rollout_cpu_s"] + m["train_cpu_s"] for m in steps) / 60
    wall = sum(m["rollout_s"] + m["train_s"] for m in steps) / 60
    return cpu, wall


def sft_minutes(record: RunRecord) -> tuple[float, float]:
    """The warm start's CPU minutes and its median CPU seconds per SFT step (step 0 also collects
    the demonstrations, so it is left out of the median)."""
    sft = [m for m in record.metrics().records if m.get("stage") == "sft"]
    per_step = [m["sft_cpu_s"] for m in sft if m["step"] > 0]
    return sum(m["sft_cpu_s"] for m in sft) / 60, float(statistics.median(per_step)) if per_step else 0.0


def update_figures(record: RunRecord) -> tuple[float | None, float | None, str | None, float | None]:
    """(median update seconds, median update FLOP bound, matmul dtype, matmul FLOP/s the trainer
    measured as it started) of the run's RL steps."""
    steps = [m for m in record.metrics().records if m.get("stage") is None and "train/update_s" in m]
    device = next((e for e in record.events().records if e.get("event") == "trainer_device"), {})
    dtype = str(device["compute_dtype"]) if "compute_dtype" in device else None
    rate = float(device["matmul_flops_per_s"]) if "matmul_flops_per_s" in device else None
    if not steps:
        return None, None, dtype, rate
    seconds = float(statistics.median(m["train/update_s"] for m in steps))
    return seconds, float(statistics.median(m["train/model_flops"] for m in steps)), dtype, rate


def bound_line(rl: Measured, rates: dict[str, float]) -> str | None:
    """The updates' median seconds against their FLOP bound at the matmul rate the trainer measured
    as the run started (runs recorded before it did so: measured in this sitting, and said so)."""
    if rl.update_s is None or rl.update_flops is None or rl.compute_dtype is None:
        return None
    rate, when = rl.matmul_rate, "measured as the run started"
    if rate is None:
        if rl.compute_dtype not in rates:
            rates[rl.compute_dtype] = matmul_flops(getattr(torch, rl.compute_dtype))
        rate, when = rates[rl.compute_dtype], "measured now, not in the run"
    bound = rl.update_flops / rate
    return (
        f"{'':<24}update {rl.update_s:.2f} s (median step); FLOP bound {bound:.2f} s at "
        f"{rate / 1e9:,.0f} GFLOP/s {rl.compute_dtype} matmul {when}: {rl.update_s / bound:.2f}x the bound"
    )


def finished(store: Store, spec: RunSpec) -> RunRecord | None:
    """A succeeded run of exactly `spec` already in `store` (a `--keep` directory run before)."""
    for run_id in iter_runs(store):
        record = RunRecord(store, run_id)
        if record.status()["status"] != "succeeded":
            continue
        if record.info().get("spec_hash") == spec.spec_hash() or recipe_key(
            stored_spec(record.spec())
        ) == recipe_key(spec):
            return record
    return None


async def run(store: Store, spec: RunSpec, ledger: Path, train: bool) -> Measured | None:
    """The run of `spec`: from the ledger, else from the store, else trained (unless not `train`)."""
    ledger_lines = read_ledger(ledger)
    known = ledger_lines.get(spec.spec_hash()) or ledger_lines.get(recipe_key(spec))
    if known is not None:
        return known
    record = finished(store, spec)
    if record is None:
        if not train:
            return None
        record = await train_run(store, spec)
    points = suite_points(record)
    update_s, update_flops, compute_dtype, matmul_rate = update_figures(record)
    measured = Measured(
        spec_hash=spec.spec_hash(),
        run_id=record.run_id,
        commit=code_state(record),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        first={suite: steps[min(steps)] for suite, steps in points.items()},
        last={suite: steps[max(steps)] for suite, steps in points.items()},
        cpu_min=rl_minutes(record)[0],
        wall_min=rl_minutes(record)[1],
        sft_cpu_min=sft_minutes(record)[0],
        sft_step_cpu_s=sft_minutes(record)[1],
        update_s=update_s,
        update_flops=update_flops,
        compute_dtype=compute_dtype,
        matmul_rate=matmul_rate,
        recipe=recipe_key(spec),
    )
    append_ledger(ledger, measured)
    return measured


def spec_for(store: Store, family: str, seed: int, suites: list[str], args: argparse.Namespace) -> RunSpec:
    overrides = [
        f"seed={seed}",
        f"name={family}-learning",
        f"data.train={family}-train",
        f"evaluation.suites={suites!r}".replace("'", '"'),
        "evaluation.samples_per_task=1",
        *args.set,
    ]
    if args.steps is not None:  # else the recipe's own steps and learning rate
        overrides += [f"learning.steps={args.steps}", f"evaluation.every_steps={args.steps}"]
    if args.lr is not None:
        overrides.append(f"learning.lr={args.lr}")
    return resolve_spec(
        load_spec(recipe(family, args.recipe), overrides, pin_bare=store.pin_newest), store.pin
    )


def control_of(spec: RunSpec, rl: Measured, step_cpu_s: float | None = None) -> tuple[RunSpec, int]:
    """The same spec with no RL step and the RL phase's CPU time spent on more SFT steps, priced at
    the run's own CPU seconds per SFT step, or `step_cpu_s` (a run that started from a stored warm
    start, `model.init_adapter` with no SFT step of its own, has none)."""
    per_step = step_cpu_s or rl.sft_step_cpu_s
    if not per_step:
        raise SystemExit(
            f"--control sft: run {rl.run_id} made no SFT step to price the control's steps by (it "
            "started from model.init_adapter); give --sft-step-cpu-s, e.g. the warm start's "
            "sft_step_cpu_s in the ledger"
        )
    extra = round(rl.cpu_min * 60 / per_step)
    learning = spec.learning.model_copy(update={"steps": 0, "sft_steps": spec.learning.sft_steps + extra})
    return spec.model_copy(update={"learning": learning, "name": f"{spec.name}-sft-control"}), extra


def interval(tasks: dict[str, float], seed: int, suite: str) -> Estimate:
    return task_interval(tasks, derive_seed(seed, "outcome", suite))


def margin(rl: dict[str, float], control: dict[str, float], seed: int, suite: str) -> PairedDifference:
    return paired_difference(rl, control, seed=derive_seed(seed, "control", suite))


def row(family: str, seed: int, suite: str, rl: Measured, control: Measured | None, extra: int) -> str:
    before, after = interval(rl.first[suite], seed, suite), interval(rl.last[suite], seed, suite)
    change = paired_difference(rl.last[suite], rl.first[suite], seed=derive_seed(seed, "outcome", suite))
    overlap = "overlap" if intervals_overlap(before, after) else "apart"
    text = (
        f"{family:<6}{suite:<14}{seed:>4}  {before!s:<26}{after!s:<26}"
        f"{change.estimate.value:+.3f} [{change.estimate.low:+.2f}, {change.estimate.high:+.2f}] "
        f"p={change.p_value:.3g}  {overlap:<8}{rl.cpu_min:>7.1f}{rl.wall_min:>7.1f}  {rl.commit:<19}"
    )
    if control is not None:
        ctl = interval(control.first[suite], seed, suite)
        diff = margin(rl.last[suite], control.first[suite], seed, suite)
        text += (
            f"   control {ctl!s:<26} +{extra} SFT steps, {control.sft_cpu_min:.1f} cpu-min   "
            f"RL - control {diff}"
        )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: the recipe's)")
    parser.add_argument("--lr", type=float, default=None, help="RL learning rate (default: the recipe's)")
    parser.add_argument("--heldout", type=int, default=128, help="held-out tasks per family")
    parser.add_argument(
        "--train", type=int, default=None, help="train tasks per family, generated (default: the shipped set)"
    )
    parser.add_argument("--families", nargs="+", default=["calc"], choices=[*GENERATORS, "mixed"])
    parser.add_argument("--recipe", type=Path, default=None, help="one spec for every family")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="spec overrides")
    parser.add_argument("--control", choices=["sft"], default=None, help="an equal-compute SFT control")
    parser.add_argument(
        "--sft-step-cpu-s",
        type=float,
        default=None,
        help="CPU seconds per SFT step to price the control by, where the RL run made none of its own",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the stores (run records) here")
    parser.add_argument("--ledger", type=Path, default=LEDGER, help="measured runs, one JSON line each")
    parser.add_argument("--no-train", action="store_true", help="print only what the ledger holds")
    args = parser.parse_args()
    print(
        f"{'family':<6}{'suite':<14}{'seed':>4}  {'before [95% CI] n':<26}{'after [95% CI] n':<26}"
        f"{'change (paired) [95% CI]':<34}{'CIs':<8}{'RL cpu':>7}{'wall':>7}  {'measured at':<19}"
        "(minutes)"
    )
    rates: dict[str, float] = {}  # matmul FLOP/s by dtype, measured here when first needed
    with tempfile.TemporaryDirectory(prefix="reprorl-learning-") as scratch:
        root = args.keep or Path(scratch)
        for family in args.families:
            pooled: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
            for seed in args.seeds:
                store = Store(root / f"{family}-{seed}")
                suites = register(store, family, args.heldout, args.train)
                spec = spec_for(store, family, seed, suites, args)
                rl = asyncio.run(run(store, spec, args.ledger, not args.no_train))
                if rl is None:
                    print(f"{family:<6}{'':<14}{seed:>4}  not in the ledger {args.ledger}")
                    continue
                control, extra = None, 0
                if args.control == "sft":
                    control_spec, extra = control_of(spec, rl, args.sft_step_cpu_s)
                    control = asyncio.run(run(store, control_spec, args.ledger, not args.no_train))
                    if control is None:
                        print(f"{family:<6}{'':<14}{seed:>4}  its control is not in the ledger")
                for suite in sorted(rl.last):
                    print(row(family, seed, suite, rl, control, extra), flush=True)
                    if control is not None:  # every suite's pairs, seed x task
                        a, b = pooled.setdefault(suite, ({}, {}))
                        a.update({f"{seed}/{t}": v for t, v in rl.last[suite].items()})
                        b.update({f"{seed}/{t}": v for t, v in control.first[suite].items()})
                if (line := bound_line(rl, rates)) is not None:
                    print(line, flush=True)
            for suite, (a, b) in sorted(pooled.items()):
                pooled_margin = margin(a, b, 0, suite)
                print(f"{family:<6}{suite:<14} pooled over seeds {args.seeds}: RL - control {pooled_margin}")


if __name__ == "__main__":
    main()
