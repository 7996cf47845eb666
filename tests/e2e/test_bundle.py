"""`reprorl runs export | import | verify`: a run carried to another store (SQLite to PostgreSQL)
reproduces exactly there; a damaged bundle is refused with one line naming the damage, and nothing
is registered."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from cli_support import tiny_training_store
from test_train_replay import SPEC as REPLAY_SPEC

from reprorl.cli.main import main
from reprorl.store import Store

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """A tiny finished run in a SQLite store, and its bundle: (home, run id, bundle)."""
    root = tmp_path_factory.mktemp("origin")
    tiny_training_store(root).close()
    # Four RL steps of a recipe that learns even on the tiny model: several kept policy versions.
    (root / "spec.toml").write_text(REPLAY_SPEC.replace("steps = 20", "steps = 4"))
    home = root / "home"
    assert main(["--home", str(home), "run", str(root / "spec.toml")]) == 0
    (run_id,) = [p.name for p in (home / "runs").iterdir() if not p.name.startswith(".")]
    # The tiny model is a folder no package ships: it travels in the bundle.
    (root / "out").mkdir()
    export = ["runs", "export", run_id, "-o", str(root / "out"), "--with-models", "--versions", "all"]
    assert main(["--home", str(home), *export]) == 0
    (bundle,) = (root / "out").iterdir()
    assert bundle.name.startswith(f"{run_id}-") and bundle.suffix == ".tar"  # <run id>-<id prefix>.tar
    return home, run_id, bundle


def cli_json(
    capsys: pytest.CaptureFixture[str], *argv: str, codes: tuple[int, ...] = (0,)
) -> dict[str, object]:
    capsys.readouterr()
    assert main([*argv, "--json"]) in codes
    value: dict[str, object] = json.loads(capsys.readouterr().out)
    return value


def test_an_imported_run_reproduces_exactly_on_another_registry_backend(
    exported: tuple[Path, str, Path], tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    origin, run_id, bundle = exported
    home = ["--home", str(tmp_path / "home"), "--db-url", pg_url]
    imported = cli_json(capsys, *home, "runs", "import", str(bundle))
    assert imported["run_id"] == run_id and imported["renumbered"] == []
    assert sorted(imported["artifacts"]) == [
        "calc-eval@v1",
        "calc-train@v1",
        "tiny-replay-adapter@v1",
        "tiny@v1",
    ]  # type: ignore[arg-type]

    # The records are the original's, byte for byte (the adapter folder rebuilt from its tree).
    here = tmp_path / "home" / "runs" / run_id
    for path in sorted((origin / "runs" / run_id).rglob("*")):
        if path.is_file() and "checkpoints" not in path.parts:
            assert (here / path.relative_to(origin / "runs" / run_id)).read_bytes() == path.read_bytes(), path
    assert json.loads((here / "import.json").read_text())["bundle"] == imported["bundle"]
    store = Store(tmp_path / "home", pg_url)
    try:
        assert store.registry.has_run(run_id)
        edges = store.registry.made_by_run(run_id)
        assert {(p, r) for _c, p, r in edges if r == "imported_from"} == {
            (imported["bundle"], "imported_from")
        }
    finally:
        store.close()

    result = cli_json(capsys, *home, "reproduce", run_id)
    assert result["matches"] and result["differences"] == [] and result["original"] == run_id

    diff = cli_json(capsys, *home, "runs", "diff", run_id, str(result["rerun"]))
    assert diff["conditions"] == [], diff


def test_verify_answers_the_audit_from_the_bundle_alone(
    exported: tuple[Path, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _origin, run_id, bundle = exported
    capsys.readouterr()
    code = main(["runs", "verify", str(bundle), "--json"])
    value = json.loads(capsys.readouterr().out)
    assert value["run_id"] == run_id and value["signer"] is None
    audit = value["audit"]
    assert len(audit["answers"]) >= 9
    assert code == (0 if audit["passed"] else 1)
    # Untracked files in a developer's checkout are the checkout's, not the bundle's.
    missing = [
        line
        for a in audit["answers"]
        for line in a["missing"]
        if "untracked code not in the record" not in line
    ]
    assert missing == [], audit["summary"]


def _rewrite(source: Path, target: Path, change: object) -> None:
    """Copy the tar at `source` to `target`, passing each member's (info, bytes) through `change`."""
    with tarfile.open(source) as src, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as out:
        for info in src.getmembers():
            handle = src.extractfile(info)
            data = handle.read() if handle else b""
            changed = change(info, data)  # type: ignore[operator]
            if changed is None:
                continue
            info.size = len(changed)
            out.addfile(info, io.BytesIO(changed))


def _flip(name: str) -> object:
    def change(info: tarfile.TarInfo, data: bytes) -> bytes:
        if info.name != name:
            return data
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]

    return change


def _edit_created_at(info: tarfile.TarInfo, data: bytes) -> bytes:
    """The manifest with another `created_at`, still in canonical form (its members untouched)."""
    if info.name != "manifest.json":
        return data
    manifest = json.loads(data)
    manifest["created_at"] = "2020-01-01T00:00:00+00:00"
    return (json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def _manifest(bundle: Path) -> dict[str, Any]:
    with tarfile.open(bundle) as tar:
        value: dict[str, Any] = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    return value


def _holds(bundle: Path) -> set[str]:
    """The files a bundle holds: its members, and those derived from them on reading."""
    return set(_member_names(bundle)) | {d["path"] for d in _manifest(bundle)["derived"]}


def _member_names(bundle: Path) -> list[str]:
    with tarfile.open(bundle) as tar:
        return tar.getnames()


@pytest.mark.parametrize(
    "kind", ["object", "record", "rollout part", "registry", "manifest", "removed", "added"]
)
def test_a_damaged_bundle_is_refused_naming_the_damage_and_nothing_is_registered(
    kind: str, exported: tuple[Path, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _origin, run_id, bundle = exported
    names = _member_names(bundle)
    objects = [n for n in names if n.startswith("objects/")]
    part = next(n for n in names if n.startswith(f"runs/{run_id}/rollouts/"))
    victim = {
        "object": objects[len(objects) // 2],
        "record": f"runs/{run_id}/metrics.jsonl",
        "rollout part": part,
        "registry": "registry.json",
        "manifest": "manifest.json",
        "removed": f"runs/{run_id}/events.jsonl",
        "added": "runs/extra.txt",
    }[kind]
    damaged = tmp_path / "damaged.tar"
    if kind == "removed":
        _rewrite(bundle, damaged, lambda info, data: None if info.name == victim else data)
    elif kind == "added":

        def add(info: tarfile.TarInfo, data: bytes) -> bytes:
            return data

        _rewrite(bundle, damaged, add)
        with tarfile.open(damaged, "a") as tar:  # appended after the manifest
            info = tarfile.TarInfo(victim)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"hi\n"))
    else:
        _rewrite(bundle, damaged, _flip(victim))
    home = tmp_path / "home"
    capsys.readouterr()
    assert main(["--home", str(home), "runs", "import", str(damaged)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and victim in err, err
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
    assert not (home / "objects").exists() or not any((home / "objects").iterdir())
    store = Store(home)
    try:
        assert store.registry.versions() == [] and store.registry.runs() == []
    finally:
        store.close()
    assert main(["runs", "verify", str(damaged)]) == 2
    assert victim in capsys.readouterr().err


def test_an_edited_manifest_is_refused_by_the_id_its_file_name_carries(
    exported: tuple[Path, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Edited in canonical form, its member list untouched: only the id can tell, and the name has it."""
    _origin, _run_id, bundle = exported

    edited = tmp_path / bundle.name
    _rewrite(bundle, edited, _edit_created_at)
    capsys.readouterr()
    assert main(["--home", str(tmp_path / "home"), "runs", "import", str(edited)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "manifest.json was edited" in err, err
    assert not (tmp_path / "home" / "runs").exists()


def test_a_signed_bundle_names_its_signer_and_an_edited_manifest_breaks_the_signature(
    exported: tuple[Path, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    origin, run_id, _bundle = exported
    key = tmp_path / "key.pem"
    assert main(["runs", "keygen", str(key)]) == 0
    signer = capsys.readouterr().out.split()[-1]
    assert signer.startswith("ed25519:") and oct(key.stat().st_mode & 0o777) == "0o600"
    signed = tmp_path / "signed.tar"
    home = ["--home", str(origin)]
    out = cli_json(
        capsys, *home, "runs", "export", run_id, "-o", str(signed), "--sign", str(key), "--with-models"
    )
    assert out["signer"] == signer
    # (exit 1 only where this checkout has untracked code, which the audit fails wherever it is)
    verified = cli_json(capsys, "runs", "verify", str(signed), "--signer", signer, codes=(0, 1))
    assert verified["signer"] == signer

    # Without --with-models the tiny model (shipped by no package) is named by hash only: the
    # audit from the bundle alone says its bytes are missing, and an import is refused.
    bare = tmp_path / "bare.tar"
    out = cli_json(capsys, *home, "runs", "export", run_id, "-o", str(bare))
    assert [(m["name"], m["included"], m["package"]) for m in out["models"]] == [("tiny", False, None)]  # type: ignore[union-attr, index]
    assert bare.stat().st_size < (tmp_path / "signed.tar").stat().st_size
    assert main(["runs", "verify", str(bare)]) == 1
    assert "FAIL 1." in capsys.readouterr().out
    assert main(["--home", str(tmp_path / "elsewhere"), "runs", "import", str(bare)]) == 2
    assert "--with-models" in capsys.readouterr().err

    # Re-signing with another key is a different signer; a manifest edited in canonical form
    # (so its member list still matches) fails the signature.
    edited = tmp_path / "edited.tar"
    _rewrite(signed, edited, _edit_created_at)
    capsys.readouterr()
    assert main(["runs", "verify", str(edited)]) == 2
    err = capsys.readouterr().err
    assert "manifest.sig" in err and "edited after signing" in err, err
    assert main(["runs", "verify", str(signed), "--signer", "ed25519:" + "0" * 32]) == 2
    assert "not by ed25519:000" in capsys.readouterr().err


def test_reproduce_from_a_bundle_imports_checks_the_lock_and_matches(
    exported: tuple[Path, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _origin, run_id, bundle = exported
    home = ["--home", str(tmp_path / "home")]
    capsys.readouterr()
    assert main([*home, "reproduce", "--bundle", str(bundle), "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["matches"] and result["original"] == run_id
    assert f"run {run_id} from bundle sha256:" in captured.err and ", imported" in captured.err
    assert "packages match the run's lock" in captured.err  # the same venv exported and reruns it
    # Again: the run is already here from this very bundle, so it is not imported twice.
    assert main([*home, "reproduce", "--bundle", str(bundle), "--json"]) == 0
    assert ", imported" not in capsys.readouterr().err
    assert main([*home, "reproduce", run_id, "--bundle", str(bundle)]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["ends", "none"])
def test_a_bundle_with_fewer_policy_versions_is_smaller_verifies_and_reproduces(
    exported: tuple[Path, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    origin, run_id, full = exported
    argv = ["--home", str(origin), "runs", "export", run_id, "-o", str(tmp_path / "out"), "--with-models"]
    out = cli_json(capsys, *argv, *([] if which == "ends" else ["--versions", which]))  # ends: the default
    lean = Path(str(out["path"]))
    kept = [
        json.loads(line)["rec"]
        for line in (origin / "runs" / run_id / "versions.jsonl").read_text().splitlines()
    ]
    kept.sort(key=lambda k: int(k["first_step"]))
    carried = kept[:1] + kept[-1:] if which == "ends" else []
    assert len(kept) > len(carried)
    left = sorted({k["policy_version"] for k in kept if k not in carried})
    tensors = {"objects/" + str(k["tensors"]).removeprefix("sha256:") for k in kept}
    manifest = _manifest(lean)
    assert manifest["versions"] == which and manifest["left_out"] == left == out["versions_left_out"]
    names, whole = _holds(lean), _holds(full)
    derived = {d["path"] for d in manifest["derived"]}
    # What the bundle holds (as members, or derived from them): all but the versions left out.
    assert names < whole and whole - names <= tensors and not derived & set(_member_names(lean))
    assert {"objects/" + str(k["tensors"]).removeprefix("sha256:") for k in carried} <= names
    if which == "ends":  # the warm start's adapter file, and the final adapter's, from the two ends
        assert f"runs/{run_id}/sft-adapter/adapter_model.safetensors" in derived and len(derived) == 2
    assert lean.stat().st_size < full.stat().st_size

    verified = cli_json(capsys, "runs", "verify", str(lean), codes=(0, 1))
    (replay,) = [a for a in verified["audit"]["answers"] if a["number"] == 9]  # type: ignore[index]
    # (Untracked files in a developer's checkout are the checkout's, not the bundle's.)
    assert [m for m in replay["missing"] if "untracked code not in the record" not in m] == [], replay
    assert any(f"{len(left)} of {len(kept)} policy versions left out of bundle" in n for n in replay["notes"])
    replayed = [n for n in replay["evidence"] if n.startswith("replayed ")]
    assert bool(replayed) == (which == "ends"), replay  # ends: the drawn rollouts of both ends replay

    home = ["--home", str(tmp_path / "home")]
    assert main([*home, "runs", "import", str(lean)]) == 0
    here = tmp_path / "home" / "runs" / run_id
    for path in sorted((origin / "runs" / run_id).rglob("*")):  # derived files written back exactly
        if path.is_file() and "checkpoints" not in path.parts:
            assert (here / path.relative_to(origin / "runs" / run_id)).read_bytes() == path.read_bytes(), path
    result = cli_json(capsys, *home, "reproduce", run_id)
    assert result["matches"]


def test_a_derived_member_that_does_not_match_is_refused(
    exported: tuple[Path, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    origin, run_id, _full = exported
    out = cli_json(capsys, "--home", str(origin), "runs", "export", run_id, "-o", str(tmp_path))
    wrong = "0" * 64

    def edit(info: tarfile.TarInfo, data: bytes) -> bytes:
        if info.name != "manifest.json":
            return data
        manifest = json.loads(data)
        manifest["derived"][0]["sha256"] = wrong
        canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return (canonical + "\n").encode()

    edited = tmp_path / "edited.tar"  # no id in the name: the manifest check alone must catch it
    _rewrite(Path(str(out["path"])), edited, edit)
    home = tmp_path / "home"
    assert main(["--home", str(home), "runs", "import", str(edited)]) == 2
    err = capsys.readouterr().err
    assert "derived member" in err and "does not match its sha256" in err
    assert len(err.strip().splitlines()) == 1
    assert not (home / "runs" / run_id).exists()
