"""The vLLM rollout engine's tests run real vLLM (the CPU build, `make vllm` builds `.venv-vllm`).

They are collected when an interpreter with vLLM is found (`REPRORL_VLLM_PYTHON`, else the repo's
`.venv-vllm`); REPRORL_REQUIRE_VLLM=1 (set by `make test-vllm`, which CI runs) makes its absence a
failure instead of a skip."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
_python = os.environ.get("REPRORL_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")

if not os.access(_python, os.X_OK):
    if os.environ.get("REPRORL_REQUIRE_VLLM") == "1":
        raise RuntimeError(f"REPRORL_REQUIRE_VLLM=1 but {_python} is not there: run `make vllm`")
    collect_ignore_glob = ["test_*.py"]
else:
    os.environ["REPRORL_VLLM_PYTHON"] = _python
    sys.path[:0] = [str(HERE), str(HERE.parent / "e2e"), str(HERE.parent)]
