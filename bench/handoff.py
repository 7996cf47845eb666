"""A run handed to a teammate: its bundle reproduced from a clean clone, a new venv and a new store.

The path a teammate takes, timed step by step: `git clone` of this checkout's HEAD into a scratch
folder, `make venv` there (the README's set-up, nothing installed by hand), then
`reprorl --home <new store> reproduce --bundle FILE` with the clone's own Python. Without `--bundle`
the bundle is made first: `reprorl demo` in a scratch store on this checkout, exported without
models (its size printed against the 50 MB target; the base model comes from the package the
clone's venv installs). Exit status is the reproduction's: 0 when it matched exactly.

    python bench/handoff.py [--bundle FILE] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPRORL = str(Path(sys.executable).parent / "reprorl")  # the console script of this venv


def timed(label: str, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    start = time.perf_counter()
    done: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        argv, text=True, capture_output=True, check=False, **kwargs
    )
    print(f"{label:<40} {time.perf_counter() - start:>7.0f} s  (exit {done.returncode})", flush=True)
    if done.returncode not in (0, 1):
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"{label} failed")
    return done


def make_bundle(scratch: Path) -> Path:
    home = scratch / "author"
    env = {**os.environ, "REPRORL_HOME": str(home)}
    timed("author: reprorl demo", [REPRORL, "demo"], env=env, cwd=ROOT)
    runs = sorted(p.name for p in (home / "runs").iterdir() if not p.name.startswith("."))
    out = scratch / "bundle"
    out.mkdir()
    done = timed(
        "author: reprorl runs export",
        [REPRORL, "runs", "export", runs[-1], "-o", str(out), "--json"],
        env=env,
    )
    exported = json.loads(done.stdout)
    print(f"bundle {exported['bundle']}: {exported['bytes'] / 1e6:.1f} MB without models (target < 50 MB)")
    return Path(exported["path"])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--bundle", type=Path, default=None, help="a bundle to reproduce (default: the demo's)"
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the clone, venv and stores here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reprorl-handoff-") as tmp:
        scratch = args.keep or Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        bundle = args.bundle or make_bundle(scratch)
        clone = scratch / "clone"
        start = time.perf_counter()
        timed("teammate: git clone", ["git", "clone", "-q", str(ROOT), str(clone)])
        timed("teammate: make venv", ["make", "venv"], cwd=clone)
        done = timed(
            "teammate: reprorl reproduce --bundle",
            [
                str(clone / ".venv" / "bin" / "reprorl"),
                "--home",
                str(scratch / "teammate"),
                "reproduce",
                "--bundle",
                str(bundle.resolve()),
                "--json",
            ],
            cwd=clone,
        )
        print(f"{'teammate: total':<40} {time.perf_counter() - start:>7.0f} s")
        sys.stderr.write(done.stderr[-3000:])
        try:
            result = json.loads(done.stdout)
        except ValueError:
            raise SystemExit("reproduce printed no result; its messages are above") from None
        print(
            f"reproduced exactly: {result['matches']} ({result['lines_compared']} metric lines, "
            f"final weights {result['adapter']['rerun']})"
        )
        raise SystemExit(0 if result["matches"] else 1)


if __name__ == "__main__":
    main()
