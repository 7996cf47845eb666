"""Each fault of `bench/faults.py`, injected once into a real run: the run finishes, loses no record,
and samples every token, reward and end the same run with no fault samples.

A run the fault does not stop ends bit-identical to that run; the bench counts bit-identity over
many trials of every fault.

The kill-and-resume trials of the synchronous and asynchronous loops, and the Ray worker and trainer
kills, have tests of their own (`tests/e2e/test_train_resume.py`, `test_async_resume.py`,
`test_ray_workers.py`); the bench runs them all many times.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from faultlib import FAULTS, Trial, load_faults
from faultlib.harness import Bench

pytestmark = pytest.mark.slow
load_faults()


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    yield Bench(tmp_path_factory.mktemp("faults"))


def _one(bench: Bench, name: str, seed: int = 7) -> Trial:
    (trial,) = FAULTS[name].run(bench, 1, random.Random(seed))
    return trial


def _whole(trial: Trial, *, tokens: bool = True) -> None:
    assert trial.finished, trial.notes
    assert trial.lost == 0, trial.notes
    assert trial.same_tokens or not tokens, trial.notes


@pytest.mark.parametrize("name", ["sandbox zygote", "verifier pool"])
def test_a_helper_process_killed_under_a_run_leaves_it_bit_identical(bench: Bench, name: str) -> None:
    trial = _one(bench, name)
    _whole(trial)
    assert trial.identical, trial.notes


@pytest.mark.parametrize("name", ["corrupt rollout part", "torn or altered metrics line"])
def test_records_damaged_before_a_resume_are_written_again(bench: Bench, name: str) -> None:
    trial = _one(bench, name)
    _whole(trial)
    assert trial.identical, trial.notes
    assert "the damage was found and named on resume" in trial.notes


def test_a_full_disk_is_one_line_and_the_resume_after_freeing_space_is_exact(bench: Bench) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting the small tmpfs the store fills needs root")
    trial = _one(bench, "disk full")
    _whole(trial)
    assert "refused in one line naming the disk and the resume" in trial.notes


def test_running_out_of_memory_mid_run_leaves_a_resumable_run(bench: Bench) -> None:
    """Where the refused allocation lands is chance: in a Python frame (the one-line error), in
    native code that does not check it (the process crashes like a kill), or in an episode (an infra
    failure, sampled again); the run may also need no more memory and finish. It never hangs."""
    trial = _one(bench, "trainer out of memory", seed=3)
    # An episode cut short by a refused allocation is sampled again in another batch: its tokens
    # may differ, and it is kept, attributed to the infrastructure.
    _whole(trial, tokens=False)
    assert not any(n.startswith(("resume failed", "hung")) or "internal error" in n for n in trial.notes), (
        trial.notes
    )


def test_a_postgres_registry_restarted_mid_run_is_waited_for(bench: Bench) -> None:
    if not sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")) and shutil.which("initdb") is None:
        if os.environ.get("REPRORL_REQUIRE_PG") == "1":
            pytest.fail("PostgreSQL is not installed")
        pytest.skip("PostgreSQL is not installed")
    trial = _one(bench, "postgres restarted", seed=1)
    _whole(trial)
    assert trial.identical, trial.notes  # the run is not stopped: nothing is sampled again


def test_a_failing_inference_server_costs_retries_not_records_or_tokens(bench: Bench) -> None:
    trial = _one(bench, "inference server faults")
    _whole(trial)
    assert any(n.startswith("503 x") for n in trial.notes), trial.notes  # faults were injected
    # The server batches requests as they come, so a logprob may move in its last bits; every
    # sampled token, reward and end is the reference's.
    assert not any("infra errors" in n for n in trial.notes), trial.notes


def test_a_ray_run_killed_and_resumed_keeps_every_record(bench: Bench) -> None:
    trial = _one(bench, "kill-resume ray")
    _whole(trial)
