"""The exploration alarm on the real model: a planted run blocked from a tool its oracle needs, beside
the same run unblocked.

Both runs are the demo recipe (`configs/demo.toml`: SmolLM2-135M-Instruct, an SFT warm start on
oracle demonstrations, then RL on the calculator family) cut to a few steps, with the alarm window
`learning.tool_alarm_steps`. The planted one permits no `read` tool (`data.tool_permissions`), so
the `calc` tool its warm start taught it to call is refused every time and never runs. It prints,
per run, the calls of `calc` that ran at each step, the `tool_unexplored` alarms, and whether the
report's exploration section has its panels. Expected: the planted run raises one alarm for
calculator/calc at step `window - 1`; the unblocked run raises none.

    .venv/bin/python bench/exploration.py [--steps 4] [--window 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from importlib import resources
from pathlib import Path

from reprorl.config import load_spec, resolve_spec
from reprorl.orchestrate.jobs.train import train_run
from reprorl.orchestrate.run.exploration import ALARM_EVENT
from reprorl.policy.gguf import bundled_gguf
from reprorl.report.render import build_report
from reprorl.store import Store


def one(root: Path, name: str, blocked: bool, args: argparse.Namespace) -> None:
    store = Store(root / name)
    store.add("smollm2-135m-instruct", bundled_gguf(), kind="model")
    for taskset in ("calc-train", "calc-eval"):
        with resources.as_file(resources.files("reprorl") / "examples" / f"{taskset}.jsonl") as path:
            store.add(taskset, path, kind="taskset")
    overrides = [
        f"name=exploration-{name}",
        f"learning.steps={args.steps}",
        f"learning.tool_alarm_steps={args.window}",
        f"evaluation.every_steps={args.steps}",
        "evaluation.samples_per_task=1",
    ]
    if blocked:
        overrides.append('data.tool_permissions=["human"]')
    with resources.as_file(resources.files("reprorl") / "configs" / "demo.toml") as spec_file:
        spec = resolve_spec(load_spec(spec_file, overrides, pin_bare=store.pin_newest), store.pin)
    record = asyncio.run(train_run(store, spec))
    steps = [m for m in record.metrics().records if m.get("stage") is None]
    calls = [int(m.get("exploration/calculator/calc", -1)) for m in steps]
    alarms = [e for e in record.events().records if e["event"] == ALARM_EVENT]
    section = next(s for s in build_report(store, record).sections if s.key == "exploration")
    print(f"{name:<10} calc calls that ran per step: {calls}", flush=True)
    print(f"{'':<10} alarms: {[(e['step'], e['family'], e['tool'], e['steps']) for e in alarms] or 'none'}")
    print(f"{'':<10} report exploration section: {len(section.charts)} charts, has data: {section.has_data}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--window", type=int, default=3, help="learning.tool_alarm_steps")
    parser.add_argument("--keep", type=Path, default=None, help="keep the stores (run records) here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reprorl-exploration-") as scratch:
        root = args.keep or Path(scratch)
        one(root, "planted", True, args)
        one(root, "unblocked", False, args)


if __name__ == "__main__":
    main()
