"""The verifiers adapter's tests run in the venv `make test-verifiers` builds (verifiers pins an
`openai` and an `mcp` the main venv cannot have). Elsewhere they are not collected, unless
REPRORL_REQUIRE_VERIFIERS=1 says they must run, which makes a missing package a failure."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if importlib.util.find_spec("verifiers") is None:
    if os.environ.get("REPRORL_REQUIRE_VERIFIERS") == "1":
        raise RuntimeError("REPRORL_REQUIRE_VERIFIERS=1 but the verifiers package is not installed")
    collect_ignore_glob = ["test_*.py"]
else:
    sys.path[:0] = [str(HERE), str(HERE.parent / "e2e"), str(HERE.parent)]
