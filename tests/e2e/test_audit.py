"""`reprorl runs audit` on a tiny-model run: 10/10 PASS; each answer turns FAIL without the record proving it.

One training run serves every case: each case works on a copy of the store's home, removes or alters
one record there (with the store's own writers where the record is checksummed, so only the intended
record changes), and checks which answers fail.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_support import Cli, tiny_training_store
from sqlalchemy import delete

from reprorl.audit.audit import AuditReport, audit_run
from reprorl.cli.main import main
from reprorl.hashing import sha256_hex
from reprorl.store import RunRecord, Store, environment
from reprorl.store.registry import LineageRow
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollouts import DISCARDED_EVENT, RolloutWriter
from reprorl.store.runs import checksummed_line, read_log
from reprorl.types import Trajectory

SPEC = """
name = "audited"
seed = 5
[model]
owner = "t@x"
base = "tiny"
adapter = { kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }
[data]
owner = "t@x"
train = "calc-train"
reward_weights = { outcome = 1.0, valid_calls = 1.0 }
[learning]
owner = "t@x"
steps = 2
sft_steps = 2
lr = 1e-3
group_size = 3
tasks_per_step = 2
max_tokens = 16
max_turns = 2
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
"""
ALL = {
    "base_model",
    "data_versions",
    "rollouts",
    "reward_config",
    "adapter_lineage",
    "eval_separation",
    "eval_stability",
    "cost",
    "recreate",
    "effective_config",
}
CLEAN_CODE = {"root": "/src/project", "commit": "0123456789abcdef" * 2 + "01234567", "dirty": False}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("audited")
    tiny_training_store(tmp).close()
    (tmp / "spec.toml").write_text(SPEC)
    with pytest.MonkeyPatch.context() as patch:
        # The checkout the tests run in may hold uncommitted work, which question 9 rightly fails;
        # the baseline is recorded as made from a clean commit so its verdict does not depend on
        # that. The code rules themselves are tested below on resealed records.
        patch.setattr(environment, "git_state", lambda directory: dict(CLEAN_CODE))
        assert main(["--home", str(tmp / "home"), "run", str(tmp / "spec.toml")]) == 0
    return tmp / "home"


@pytest.fixture
def home(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained, tmp_path / "home")
    return tmp_path / "home"


def run_dir(home: Path) -> Path:
    (path,) = [p for p in (home / "runs").iterdir() if not p.name.startswith(".")]
    return path


def audit(home: Path) -> AuditReport:
    store = Store(home)
    try:
        return audit_run(store, run_dir(home).name)
    finally:
        store.close()


def failing(home: Path) -> set[str]:
    return {a.key for a in audit(home).failed}


def rewrite_log(path: Path, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """Rewrite a checksummed run log with each record passed through `change` (None drops it)."""
    records = read_log(path).records
    kept = [r for r in (change(dict(rec)) for rec in records) if r is not None]
    assert kept != records
    path.write_bytes(b"".join(checksummed_line(r) for r in kept))


def reseal(home: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Edit run.json and write its new checksum, as if the record had been written that way."""
    folder = run_dir(home)
    info = json.loads((folder / "run.json").read_text())
    change(info)
    (folder / "run.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    sums = json.loads((folder / "checksums.json").read_text())
    sums["run.json"] = sha256_hex((folder / "run.json").read_bytes())
    (folder / "checksums.json").write_text(json.dumps(sums))


def replace_part(home: Path, step: int, change: Callable[[list[Trajectory]], list[Trajectory]]) -> None:
    """Swap the rollout part of a train step for a changed copy, logged as the store logs a rewind."""
    store = Store(home)
    try:
        record = RunRecord(store, run_dir(home).name)
        (part,) = [p for p in RolloutStore(record).parts() if p.step == step]
        rows = list(RolloutStore(record).trajectories(f"step = {step}"))
        record.event(DISCARDED_EVENT, parts=[part.path.relative_to(record.path).as_posix()], reason="test")
        part.path.unlink()
        RolloutWriter(record).write(step, change(rows))
    finally:
        store.close()


def blob_path(home: Path, address: str) -> Path:
    digest = address.removeprefix("sha256:")
    return home / "objects" / digest[:2] / digest[2:]


def base_address(home: Path) -> str:
    return str(json.loads((run_dir(home) / "run.json").read_text())["inputs"]["model.base"])


def largest_file_of(home: Path, tree: str) -> Path:
    manifest = json.loads(blob_path(home, tree).read_text())
    entry = max(manifest["entries"], key=lambda e: e["size"])
    return blob_path(home, entry["hash"])


# -- the baseline --------------------------------------------------------------------------------


def test_a_recorded_run_passes_all_ten_questions_each_with_evidence(trained: Path) -> None:
    report = audit(trained)
    assert report.passed, report.to_json()
    assert [a.number for a in report.answers] == list(range(1, 11))
    assert {a.key for a in report.answers} == ALL
    assert all(a.evidence and not a.missing for a in report.answers)
    text = {a.key: "\n".join(a.evidence) for a in report.answers}
    assert "sft_done event" in text["base_model"] and "verifies" in text["base_model"]
    assert "the warm start demonstrated" in text["base_model"]
    assert "calculator: env sha256:" in text["data_versions"]
    assert "counts match metrics.jsonl" in text["rollouts"]
    assert "weights x components" in text["reward_config"]
    assert "adapter_of tiny@v1" in text["adapter_lineage"]
    assert "leakage_check event: no leak" in text["eval_separation"]
    assert "2 eval points (steps 0, 2)" in text["eval_stability"]
    assert "train rollouts in 2 steps" in text["cost"]
    assert "checksums.json" in text["recreate"] and "commit 0123456789ab, clean" in text["recreate"]


def test_the_cli_prints_the_table_and_exits_0_or_1(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = Cli(home, capsys)
    code, out, _ = cli("runs", "audit", run_dir(home).name[:12])
    assert code == 0 and out.count("│ PASS ") == 10 and "10/10 PASS" in out
    payload = cli.ok_json("runs", "audit", run_dir(home).name)
    assert payload["passed"] and [a["status"] for a in payload["answers"]] == ["PASS"] * 10
    shutil.rmtree(run_dir(home) / "rollouts")
    code, out, _ = cli("runs", "audit", run_dir(home).name)
    assert code == 1 and "FAIL" in out and "7/10 PASS; FAIL: 2, 3, 4" in out
    code, out, _ = cli("runs", "audit", run_dir(home).name, "--json")
    assert code == 1 and not json.loads(out)["passed"]
    assert (
        cli.error("runs", "audit", "no-such-run")
        == f"error: no run matches 'no-such-run' under {home / 'runs'}"
    )


def test_a_compacted_run_answers_every_question_as_before(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = audit(home)
    rows_before = RolloutStore(RunRecord(Store(home), run_dir(home).name)).query().to_pylist()
    cli = Cli(home, capsys)
    done = cli.ok_json("runs", "compact", run_dir(home).name)
    assert done["parts_before"] > done["parts_after"] == 1 and done["merged"] == 1
    assert not list((run_dir(home) / "rollouts").glob("step=*"))
    after = audit(home)
    assert after.passed, after.to_json()
    # Every answer and its evidence are the same, but for the count of part files holding them.
    parts_line = f"in {done['parts_before']} verified Parquet parts"
    for old, new in zip(before.answers, after.answers, strict=True):
        assert new.status == old.status
        expected = [e.replace(parts_line, "in 1 verified Parquet parts") for e in old.evidence]
        assert expected == list(new.evidence)
    assert RolloutStore(RunRecord(Store(home), run_dir(home).name)).query().to_pylist() == rows_before


# -- one record removed or altered: its answer fails -------------------------------------------


def corrupt_base_weights(home: Path) -> None:
    target = largest_file_of(home, base_address(home))
    target.chmod(0o644)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))


def flip_a_bit_of_the_run_adapter(home: Path) -> None:
    """The folder users load (`runs/<id>/adapter/`), not the store's copy of it."""
    target = max((run_dir(home) / "adapter").iterdir(), key=lambda p: p.stat().st_size)
    target.chmod(0o644)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))


def remove_base_blob(home: Path) -> None:
    blob_path(home, base_address(home)).unlink()


def remove_train_taskset_blob(home: Path) -> None:
    info = json.loads((run_dir(home) / "run.json").read_text())
    blob_path(home, info["inputs"]["data.train"]).unlink()


def drop_event(kind: str) -> Callable[[Path], None]:
    def apply(home: Path) -> None:
        rewrite_log(run_dir(home) / "events.jsonl", lambda r: None if r["event"] == kind else r)

    return apply


def allow_leakage(home: Path) -> None:
    def change(rec: dict[str, Any]) -> dict[str, Any]:
        if rec["event"] == "leakage_check":
            rec.update(
                event="leakage_allowed", ok=False, summary="leak: 1 calc-eval task matches train tasks"
            )
        return rec

    rewrite_log(run_dir(home) / "events.jsonl", change)


def change_env_version(home: Path) -> None:
    replace_part(
        home, 1, lambda rows: [rows[0].model_copy(update={"env_version": "sha256:" + "e" * 64}), *rows[1:]]
    )


def tamper_reward(home: Path) -> None:
    def change(rows: list[Trajectory]) -> list[Trajectory]:
        assert rows[0].reward is not None
        reward = rows[0].reward.model_copy(update={"total": rows[0].reward.total + 5.0})
        return [rows[0].model_copy(update={"reward": reward}), *rows[1:]]

    replace_part(home, 1, change)


def lose_rewards(home: Path) -> None:
    failure = "verifier outcome crashed its worker process"
    replace_part(
        home, 1, lambda rows: [r.model_copy(update={"reward": None, "error": failure}) for r in rows]
    )


def discard_failed_rollouts(home: Path) -> None:
    replace_part(home, 1, lambda rows: [r for r in rows if r.reward and r.reward.success])


def delete_rollouts(home: Path) -> None:
    shutil.rmtree(run_dir(home) / "rollouts")


def delete_lineage(home: Path) -> None:
    store = Store(home)
    try:
        with store.registry.session() as session:
            session.execute(delete(LineageRow))
    finally:
        store.close()


def repoint_eval_suite(home: Path) -> None:
    def change(rec: dict[str, Any]) -> dict[str, Any]:
        if rec.get("stage") == "eval" and rec["step"] == 2:
            rec["suite"] = "calc-eval@sha256:" + "0" * 64
        return rec

    rewrite_log(run_dir(home) / "metrics.jsonl", change)


def drop_train_time(home: Path) -> None:
    def change(rec: dict[str, Any]) -> dict[str, Any]:
        if rec.get("stage") is None and rec["step"] == 1:
            del rec["train_s"]
        return rec

    rewrite_log(run_dir(home) / "metrics.jsonl", change)


def strip_packages(home: Path) -> None:
    reseal(home, lambda info: info["environment"].pop("packages"))


def edit_run_json_unsealed(home: Path) -> None:
    path = run_dir(home) / "run.json"
    path.write_text(path.read_text().replace('"root": 5', '"root": 6'))


def dirty_without_diff(home: Path) -> None:
    reseal(home, lambda info: info["environment"]["code"]["cwd"].update(dirty=True))


def untracked_code(home: Path) -> None:
    code = {"dirty": True, "diff": "diff --git a/x.py b/x.py\n", "untracked": ["notes.txt", "src/pkg/new.py"]}
    reseal(home, lambda info: info["environment"]["code"]["cwd"].update(code))


def lose_a_kept_policy_version(home: Path) -> None:
    """The weights a rollout was sampled from are gone: the run can no longer be replayed."""
    kept = read_log(run_dir(home) / "versions.jsonl").records
    Store(home).blobs.path_of(str(kept[-1]["tensors"]), verify=False).unlink()


REPOSITORY = Path(__file__).resolve().parents[2]


def commit_in_no_repository(home: Path) -> None:
    code = {"root": str(REPOSITORY), "commit": "f" * 40, "dirty": False}
    reseal(home, lambda info: info["environment"]["code"]["cwd"].update(code))


def _name(case: Any) -> str:
    return str((case.values if hasattr(case, "values") else case)[0].__name__)


CASES: list[Any] = [
    (corrupt_base_weights, {"base_model"}),
    (remove_base_blob, {"base_model", "recreate"}),
    (drop_event("sft_done"), {"base_model"}),
    (change_env_version, {"data_versions"}),
    (remove_train_taskset_blob, {"data_versions", "recreate"}),
    (discard_failed_rollouts, {"rollouts"}),
    (delete_rollouts, {"rollouts", "data_versions", "reward_config"}),
    (tamper_reward, {"reward_config"}),
    (lose_rewards, {"reward_config"}),
    (delete_lineage, {"adapter_lineage"}),
    (flip_a_bit_of_the_run_adapter, {"adapter_lineage"}),
    (drop_event("adapter_saved"), {"adapter_lineage"}),
    (drop_event("leakage_check"), {"eval_separation"}),
    (allow_leakage, {"eval_separation"}),
    (repoint_eval_suite, {"eval_stability"}),
    (drop_train_time, {"cost"}),
    (strip_packages, {"recreate"}),
    (edit_run_json_unsealed, {"recreate"}),
    (dirty_without_diff, {"recreate"}),
    (untracked_code, {"recreate"}),
    (lose_a_kept_policy_version, {"recreate"}),
    pytest.param(
        commit_in_no_repository,
        {"recreate"},
        marks=pytest.mark.skipif(not (REPOSITORY / ".git").exists(), reason="not run from a git checkout"),
    ),
]


@pytest.mark.parametrize(("damage", "expected"), CASES, ids=[_name(c) for c in CASES])
def test_removing_the_proving_record_fails_its_answer(
    home: Path, damage: Callable[[Path], None], expected: set[str]
) -> None:
    damage(home)
    report = audit(home)
    assert {a.key for a in report.failed} == expected, report.to_json()
    for answer in report.failed:
        assert answer.missing and all(line.strip() for line in answer.missing)


def test_a_failure_names_the_missing_record(home: Path) -> None:
    drop_event("leakage_check")(home)
    (missing,) = audit(home).answer("eval_separation").missing
    assert missing.startswith("no leakage_check event in events.jsonl")
    shutil.rmtree(run_dir(home) / "rollouts")
    (missing,) = audit(home).answer("rollouts").missing
    assert "rollout part" in missing and "was written, now missing" in missing


def test_untracked_files_that_are_not_code_are_noted_not_failed(home: Path) -> None:
    code = {"dirty": True, "diff": "diff --git a/x.py b/x.py\n", "untracked": ["notes.txt"]}
    reseal(home, lambda info: info["environment"]["code"]["cwd"].update(code))
    answer = audit(home).answer("recreate")
    assert answer.passed and any("1 untracked non-code file(s)" in n for n in answer.notes)
    assert any("the recorded diff" in e for e in answer.evidence)


def test_a_second_run_that_makes_the_same_bytes_registers_its_own_version_and_both_audits_pass(
    home: Path, tmp_path: Path
) -> None:
    (tmp_path / "spec.toml").write_text(SPEC)
    (first,) = [p.name for p in (home / "runs").iterdir() if not p.name.startswith(".")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(environment, "git_state", lambda directory: dict(CLEAN_CODE))
        assert main(["--home", str(home), "run", str(tmp_path / "spec.toml")]) == 0
    (second,) = [p.name for p in (home / "runs").iterdir() if not p.name.startswith(".") and p.name != first]
    store = Store(home)
    try:
        versions = store.registry.versions("audited-adapter")
        assert len(versions) == 2 and versions[0].hash == versions[1].hash  # a bit-reproducible run
        assert [v.meta["run_id"] for v in versions] == [first, second]
        assert {run for _, relation, run in store.registry.parents(versions[0].hash)} == {first, second}
        for run_id in (first, second):
            report = audit_run(store, run_id)
            assert report.passed, (run_id, [a.to_json() for a in report.failed])
    finally:
        store.close()


def test_a_record_edited_to_claim_another_loss_fails_the_effective_config_question_naming_the_field(
    home: Path,
) -> None:
    path = run_dir(home) / "effective.json"
    document = json.loads(path.read_text())
    assert document["fields"]["learning.loss.kind"] == "ppo_clip"
    document["fields"]["learning.loss.kind"] = "reinforce"
    path.write_text(json.dumps(document))
    (answer,) = [a for a in audit(home).failed if a.key == "effective_config"]
    assert any(line.startswith("learning.loss.kind: spec.json says 'ppo_clip'") for line in answer.missing)
    assert any("changed after the run wrote it" in line for line in answer.missing)


def test_a_spec_resealed_to_claim_another_loss_disagrees_with_what_the_trainer_used(home: Path) -> None:
    folder = run_dir(home)
    spec = json.loads((folder / "spec.json").read_text())
    spec["learning"]["loss"] = {"kind": "reinforce"}
    (folder / "spec.json").write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    sums = json.loads((folder / "checksums.json").read_text())
    sums["spec.json"] = sha256_hex((folder / "spec.json").read_bytes())
    (folder / "checksums.json").write_text(json.dumps(sums))
    failed = {a.key: a for a in audit(home).failed}
    assert "effective_config" in failed
    lines = failed["effective_config"].missing
    assert list(lines) == [
        "learning.loss.kind: spec.json says 'reinforce', the component that uses it reported 'ppo_clip'"
    ]
