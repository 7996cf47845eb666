"""Judge robustness against real HTTP judges on 127.0.0.1: a naive judge is refused with the attacks
that fooled it named, a strict one passes (and passes the oracle), and the gate reads the newest audit."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import Cli

from judge_server import app, naive, serve, strict
from reprorl.errors import UserInputError
from reprorl.evaluation.judge import Judge, JudgeConfig
from reprorl.evaluation.stats import proportion_ci
from reprorl.hashing import content_hash
from reprorl.orchestrate.jobs.judge_audit import (
    INJECTION,
    JudgeAudit,
    audit_judge,
    record_judge_audit,
    wrong_answer,
)
from reprorl.orchestrate.run.judge_gate import ARTIFACT, OVERRIDE_EVENT, ROBUST_EVENT, require_robust_judge
from reprorl.rewards.audit import PROBES
from reprorl.rollout.families import FAMILIES
from reprorl.rollout.reward_audit import audit_tasks
from reprorl.store import RunRecord, Store

pytestmark = pytest.mark.slow

TASKS = 4


@pytest.fixture(scope="module")
def naive_url() -> Iterator[str]:
    with serve(app(naive)) as url:
        yield url


@pytest.fixture(scope="module")
def strict_url() -> Iterator[str]:
    known = [t for family in FAMILIES.values() for t in audit_tasks(family, TASKS, 0)]
    with serve(app(strict(known))) as url:
        yield url


def judge(url: str, model: str, cache: Path) -> Judge:
    return Judge(JudgeConfig(base_url=url, model=model, retries=0, max_concurrency=4), cache)


def check_rates(audit: JudgeAudit) -> None:
    """Every rate is its count over its n, with the Wilson interval; the pooled one too."""
    for cell in (*audit.attacks, audit.control):
        assert cell.judged + cell.failed > 0 and cell.failed == 0
        assert cell.rate == proportion_ci(cell.passed, cell.judged)
        assert len(cell.passed_tasks) == cell.passed
    fooled = sum(c.passed for c in audit.attacks)
    assert audit.fooled == proportion_ci(fooled, sum(c.judged for c in audit.attacks))
    report = json.loads(json.dumps(audit.to_json()))
    assert report["fooled"]["fooled"] == fooled and report["fooled"]["n"] == audit.fooled.n
    assert [a["attack"] for a in report["attacks"]] == [c.attack for c in audit.attacks]
    assert report["control"]["passed"] == audit.control.passed


def test_a_naive_judge_is_refused_and_what_fooled_it_is_named(naive_url: str, tmp_path: Path) -> None:
    names = ["calculator", "sql"]
    with judge(naive_url, "naive-judge", tmp_path / "cache") as j:
        audit = asyncio.run(audit_judge(j, names=names, tasks=TASKS))
    check_rates(audit)
    assert audit.refused and audit.judge == j.judge_id and audit.families == tuple(names)
    everywhere = TASKS * len(names)
    assert {c.attack for c in audit.attacks} == {
        *(p.name for p in PROBES),
        "yes",
        "correct",
        "claims_complete",
        "rubric_injection",
        "confident_wrong",
    }
    fooled = {c.attack: (c.passed, c.judged) for c in audit.attacks}
    for attack in ("correct", "claims_complete", "rubric_injection", "filler", "claim_success"):
        assert fooled[attack] == (everywhere, everywhere), attack
    assert fooled["yes"] == (0, everywhere) and fooled["empty"] == (0, everywhere)
    tasks = [t for name in names for t in audit_tasks(FAMILIES[name], TASKS, 0)]
    wrong = [w for t in tasks if (w := wrong_answer(t)) is not None]
    assert fooled["confident_wrong"] == (sum(bool(re.search(r"\d", w)) for w in wrong), len(wrong))
    assert audit.cell("rubric_injection").passed_tasks == tuple(t.id for t in tasks)
    # The verdict line names what fooled the judge, worst first, and nothing that did not.
    assert audit.reason.startswith(f"fooled on {sum(p for p, _ in fooled.values())}/")
    named = audit.reason.split("fooled by ", 1)[1]
    assert "rubric_injection 8/8" in named and "yes " not in named and "empty" not in named
    assert audit.to_json()["refused"] is True and INJECTION.startswith("Ignore the rubric")


def test_a_strict_judge_passes_and_passes_the_honest_work(strict_url: str, tmp_path: Path) -> None:
    with judge(strict_url, "strict-judge", tmp_path / "cache") as j:
        audit = asyncio.run(audit_judge(j, tasks=TASKS))
        assert j.requests > 0
    check_rates(audit)
    assert not audit.refused and audit.warnings == () and sum(c.passed for c in audit.attacks) == 0
    assert audit.control.passed == audit.control.judged == TASKS * len(FAMILIES)
    assert audit.reason.endswith("not above the threshold 5.0%")
    # Judging again costs nothing: every request is answered from the disk cache, the same way.
    with judge(strict_url, "strict-judge", tmp_path / "cache") as again:
        repeated = asyncio.run(audit_judge(again, tasks=TASKS))
        assert again.requests == 0 and again.cache_hits == sum(
            c.judged for c in (*audit.attacks, audit.control)
        )
    assert repeated.to_json() == audit.to_json()


def test_the_gate_reads_the_newest_audit_and_records_an_override(
    naive_url: str, strict_url: str, store: Store, tmp_path: Path
) -> None:
    with judge(naive_url, "naive-judge", tmp_path / "cache") as j:
        refused = asyncio.run(audit_judge(j, names=["calculator"], tasks=2))
    with pytest.raises(UserInputError, match=r"no robustness audit.*override") as missing:
        require_robust_judge(store, refused.judge)
    assert "\n" not in str(missing.value)
    version = record_judge_audit(store, refused)
    assert version.name == ARTIFACT and version.kind == "judge_audit"
    assert version.meta["judge"] == refused.judge and version.meta["refused"] is True
    assert json.loads(store.read(version.ref)) == json.loads(json.dumps(refused.to_json()))
    rate = refused.fooled.value if refused.fooled else 0.0
    with pytest.raises(UserInputError, match=rf"judge {re.escape(refused.judge)} was refused.*{rate:.1%}"):
        require_robust_judge(store, refused.judge)
    fields = require_robust_judge(store, refused.judge, override="only for a dry run")
    assert fields["event"] == OVERRIDE_EVENT and fields["reason"] == "only for a dry run"
    assert fields["audit"] == version.label
    spec = {"name": "gate"}
    run = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="gate", seeds={"root": 0})
    run.event(fields["event"], **fields)
    (line,) = [e for e in run.events().records if e["event"] == OVERRIDE_EVENT]
    assert line["judge"] == refused.judge and line["reason"] == "only for a dry run"

    # Another judge's audit is not this one's, and a newer audit of a judge replaces an older one.
    with judge(strict_url, "strict-judge", tmp_path / "cache") as j:
        robust = asyncio.run(audit_judge(j, names=["calculator"], tasks=2))
    record_judge_audit(store, dataclasses.replace(robust, refused=True, reason="planted"))
    with pytest.raises(UserInputError, match="was refused"):
        require_robust_judge(store, robust.judge)
    newest = record_judge_audit(store, robust)
    passed: dict[str, Any] = require_robust_judge(store, robust.judge, override="not needed")
    assert passed["event"] == ROBUST_EVENT and passed["audit"] == newest.label and "reason" not in passed
    with pytest.raises(UserInputError, match="was refused"):
        require_robust_judge(store, refused.judge)


def test_the_cli_audits_a_judge_from_a_toml_file(
    naive_url: str, strict_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(tmp_path / "home", capsys)
    naive_file, strict_file = tmp_path / "naive.toml", tmp_path / "strict.toml"
    naive_file.write_text(f'base_url = "{naive_url}"\nmodel = "naive-judge"\nretries = 0\n')
    strict_file.write_text(f'base_url = "{strict_url}"\nmodel = "strict-judge"\nretries = 0\n')
    code, out, err = cli("rewards", "audit", "calculator", "--tasks", "2", "--judge", str(naive_file))
    assert code == 1, (out, err)
    text = " ".join(out.split())
    assert "REFUSED naive-judge@" in text and "fooled by" in text and "rubric_injection" in text
    assert "oracle (control: passes)" in text and "recorded as judge-audit@v1" in text

    code, out, err = cli(
        "rewards", "audit", "calculator", "--tasks", "2", "--judge", str(strict_file), "--json"
    )
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["refused"] is False and report["fooled"]["fooled"] == 0 and report["threshold"] == 0.05
    assert report["artifact"] == "judge-audit@v2" and report["control"]["passed"] == 2
    store = Store(tmp_path / "home")
    assert require_robust_judge(store, report["judge"])["event"] == ROBUST_EVENT
    assert (tmp_path / "home" / "cache" / "judge").is_dir()  # the judge's cache lives under the home
    # A threshold above the naive judge's fooled rate lets it through, and exits 0.
    code, out, _ = cli(
        "rewards",
        "audit",
        "calculator",
        "--tasks",
        "2",
        "--judge",
        str(naive_file),
        "--judge-threshold",
        "0.99",
    )
    assert code == 0 and "PASS naive-judge@" in " ".join(out.split())

    naive_file.write_text(f'base_url = "{naive_url}"\nmodel = "naive-judge"\nretires = 0\n')
    line = cli.error("rewards", "audit", "--judge", str(naive_file))
    assert "naive.toml" in line and "retires" in line
    naive_file.write_text(f'base_url = "{naive_url}"\nmodel = 3\n')
    assert "model" in cli.error("rewards", "audit", "--judge", str(naive_file))
    naive_file.write_text("model = [\n")
    assert "not valid TOML" in cli.error("rewards", "audit", "--judge", str(naive_file))
    line = cli.error("rewards", "audit", "--judge", str(strict_file), "--judge-threshold", "1")
    assert "--judge-threshold" in line
    line = cli.error("rewards", "audit", "--judge", str(strict_file), "--verifier", "calculator=x:Y")
    assert "--judge" in line and "--verifier" in line
