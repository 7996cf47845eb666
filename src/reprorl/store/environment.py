"""What a run ran on: code version, software versions and hardware, captured at run creation."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

GIT_TIMEOUT_S = 10.0
MAX_DIFF_BYTES = 2 << 20
_CREDENTIALS = re.compile(r"://([^:/@]*):[^@/]+@")


def _run(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            args,
            cwd=cwd,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


def git_state(directory: Path) -> dict[str, Any] | None:
    """Commit, dirty flag and (when dirty) the diff of the repository holding `directory`."""
    if shutil.which("git") is None:
        return None
    top = _run(["git", "rev-parse", "--show-toplevel"], directory)
    commit = _run(["git", "rev-parse", "HEAD"], directory)
    if top is None:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=normal"], directory) or ""
    dirty = bool(status.strip())
    state: dict[str, Any] = {
        "root": top.strip(),
        "commit": commit.strip() if commit else None,
        "dirty": dirty,
    }
    if dirty:
        diff = _run(["git", "diff", "HEAD", "--binary"], directory) if commit else None
        diff = diff if diff is not None else ""
        state["diff_truncated"] = len(diff) > MAX_DIFF_BYTES
        state["diff"] = diff[:MAX_DIFF_BYTES]
        state["untracked"] = [line[3:] for line in status.splitlines() if line.startswith("??")]
    return state


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        Path.cwd(),
    )
    return [line.strip() for line in (out or "").splitlines() if line.strip()]


def _packages() -> dict[str, str]:
    """Each installed distribution's version as Python imports it: where a name is installed twice,
    the first on `sys.path` (the one `import` finds), not the last one listed."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
    return dict(sorted(found.items()))


def _settings_env() -> dict[str, str]:
    """Environment variables that steer reprorl or the math libraries, with secrets masked."""
    kept: dict[str, str] = {}
    for key, value in sorted(os.environ.items()):
        if not key.startswith(("REPRORL_", "CUDA_", "OMP_", "MKL_", "OPENBLAS_", "TORCH_")):
            continue
        if any(word in key for word in ("TOKEN", "SECRET", "PASSWORD", "KEY")):
            value = "***"
        kept[key] = _CREDENTIALS.sub(r"://\1:***@", value)
    return kept


def capture_environment(cwd: Path | None = None) -> dict[str, Any]:
    """Everything outside the spec that can change a result, as plain JSON."""
    cwd = cwd or Path.cwd()
    package_dir = Path(__file__).resolve().parents[1]
    code = {"cwd": git_state(cwd)}
    package_git = git_state(package_dir)
    if package_git and (code["cwd"] is None or package_git["root"] != code["cwd"]["root"]):
        code["reprorl"] = package_git
    return {
        "code": code,
        "python": sys.version,
        "executable": sys.executable,
        "packages": _packages(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu": {"model": _cpu_model(), "count": os.cpu_count()},
        "gpus": _gpus(),
        "env": _settings_env(),
    }
