"""`reprorl rewards audit`: every built-in verifier resists every exploit probe, and a planted weak
verifier is caught and named."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from cli_support import Cli
from planted_verifiers import DigitsAnywhere

from reprorl.rewards.audit import PROBES
from reprorl.rollout.families import FAMILIES
from reprorl.rollout.reward_audit import IMPOSSIBLE, ORACLE, TASKS, audit_rewards

pytestmark = pytest.mark.slow

TASKS_PER_FAMILY = 6


def test_every_built_in_verifier_passes_every_probe(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, err = Cli(tmp_path / "home", capsys)(
        "rewards", "audit", "--tasks", str(TASKS_PER_FAMILY), "--json"
    )
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["passed"] is True
    assert sorted(v["family"] for v in report["verifiers"]) == sorted(FAMILIES)
    for verifier in report["verifiers"]:
        cells = {(c["probe"], c["variant"]): c for c in verifier["cells"]}
        # Every probe and the oracle played every task and every impossible variant.
        assert set(cells) == {
            (p, v) for p in (ORACLE, *(p.name for p in PROBES)) for v in (TASKS, IMPOSSIBLE)
        }
        assert all(c["episodes"] == TASKS_PER_FAMILY and c["errors"] == 0 for c in cells.values())
        assert cells[(ORACLE, TASKS)]["hits"] == TASKS_PER_FAMILY  # the control: honest work is rewarded
        assert sum(c["hits"] for k, c in cells.items() if k != (ORACLE, TASKS)) == 0
        # Cross verifiers face the same probes on the real tasks, with the oracle as their control too.
        assert set(verifier["cross"]) == {type(c).__name__ for c in FAMILIES[verifier["family"]].cross}
        for cross_cells in verifier["cross"].values():
            hits = {c["probe"]: c["hits"] for c in cross_cells if c["variant"] == TASKS}
            assert hits == {ORACLE: TASKS_PER_FAMILY, **{p.name: 0 for p in PROBES}}
    calculator = next(v for v in report["verifiers"] if v["family"] == "calculator")
    assert list(calculator["cross"]) == ["ExpressionAnswer"]


def test_a_verifier_that_accepts_the_digits_anywhere_fails_and_is_named(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    weak = {"calculator": dataclasses.replace(FAMILIES["calculator"], verifier=DigitsAnywhere())}
    (audit,) = asyncio.run(audit_rewards(weak, tasks=4))
    assert not audit.passed and audit.verifier == "DigitsAnywhere"
    assert audit.cell("every_answer").hits == 4  # the true number sits inside the spray of guesses
    assert audit.cell(ORACLE).hits == 4  # it still rewards honest work: only the probes expose it
    assert any(f.startswith("every_answer earned reward on 4/4 tasks") for f in audit.failures)
    # The CLI names it and exits 1.
    code, out, _ = Cli(tmp_path / "home", capsys)(
        "rewards",
        "audit",
        "calculator",
        "--tasks",
        "2",
        "--verifier",
        "calculator=planted_verifiers:DigitsAnywhere",
    )
    assert code == 1
    assert "FAIL calculator: DigitsAnywhere — every_answer earned reward on 2/2 tasks" in " ".join(
        out.split()
    )


def test_a_bad_verifier_path_is_one_line(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    line = Cli(tmp_path / "home", capsys).error(
        "rewards", "audit", "--verifier", "calculator=no_such_module:X"
    )
    assert "--verifier" in line and "no_such_module" in line


def test_a_registered_verifier_is_audited_by_its_name(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    cli = Cli(tmp_path / "home", capsys)
    code, out, _ = cli("rewards", "audit", "calculator", "--tasks", "2", "--verifier", "calculator=numeric")
    assert code == 0 and "PASS calculator: NumericAnswer" in " ".join(out.split())
    line = cli.error("rewards", "audit", "--verifier", "calculator=nope")
    known = "env-reported, expression, file_tree, numeric, sqlite_state, verifiers-taskset"
    assert line.endswith(f"no verifier 'nope'; verifiers: {known}")


def test_shaping_that_pays_for_no_work_fails_the_audit_and_a_penalty_passes(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    # valid_calls is 1.0 for an episode with no call: weighed above 0 it pays a claim of success.
    (paid,) = asyncio.run(
        audit_rewards(names=["calculator"], tasks=2, weights={"outcome": 1.0, "valid_calls": 0.1})
    )
    assert not paid.passed
    assert paid.cell("claim_success").hits == 2 and paid.cell("claim_success", IMPOSSIBLE).hits == 2
    assert paid.cell(ORACLE, IMPOSSIBLE).hits == 2  # the oracle's honest no-answer is paid too
    # A penalty on failing calls takes nothing from honest work and pays no probe.
    cli = Cli(tmp_path / "home", capsys)
    code, out, err = cli(
        "rewards",
        "audit",
        "calculator",
        "--tasks",
        "2",
        "--weight",
        "outcome=1",
        "--weight",
        "failed_calls=-0.1",
    )
    assert code == 0 and "PASS calculator" in " ".join(out.split()), (out, err)
    line = cli.error("rewards", "audit", "calculator", "--weight", "failed_calls=0.5")
    assert line.startswith("error: --weight:") and "failed_calls = -0.1" in line
