"""Loading, overriding, hashing and pinning run specs through the library API."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from reprorl import hardware
from reprorl.config import (
    ArtifactRef,
    RunSpec,
    apply_overrides,
    ensure_resolved,
    is_resolved,
    iter_refs,
    load_spec,
    resolve_spec,
    validate_spec,
)
from reprorl.config.load import stored_spec
from reprorl.errors import FloatingReferenceError, ReprorlError, SpecError

SPEC = """\
name = "load-test"
seed = 1

[model]
owner = "model-team"
base = "base-model@v1"
init_adapter = "warm-start@v2"

[data]
owner = "data-team"
train = "train-set@v1"

[learning]
owner = "rl-team"
lr = 1e-5
steps = 4

[evaluation]
owner = "eval-team"
suites = ["suite-a@v1", "suite-b@v1"]
"""

# The same spec with sections and keys in another order.
SPEC_REORDERED = """\
seed = 1
name = "load-test"

[evaluation]
suites = ["suite-a@v1", "suite-b@v1"]
owner = "eval-team"

[learning]
steps = 4
lr = 1e-5
owner = "rl-team"

[data]
train = "train-set@v1"
owner = "data-team"

[model]
init_adapter = "warm-start@v2"
base = "base-model@v1"
owner = "model-team"
"""

REFS = {
    ("model", "base"): "base-model@v1",
    ("model", "init_adapter"): "warm-start@v2",
    ("data", "train"): "train-set@v1",
    ("evaluation", "suites", 0): "suite-a@v1",
    ("evaluation", "suites", 1): "suite-b@v1",
}


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def fake_hash(ref: str) -> str:
    """A stable 64-hex digest per reference, standing in for a registry."""
    return "sha256:" + hashlib.sha256(ref.encode()).hexdigest()


def test_overrides_are_typed_as_toml(tmp_path: Path) -> None:
    data = apply_overrides({"seed": 1}, ["learning.lr=3e-5", "seed=3", "model.base=foo@v2", "x.flag=true"])
    assert data["learning"]["lr"] == 3e-5 and type(data["learning"]["lr"]) is float
    assert data["seed"] == 3 and type(data["seed"]) is int
    assert data["model"]["base"] == "foo@v2" and type(data["model"]["base"]) is str
    assert data["x"]["flag"] is True

    spec = load_spec(write(tmp_path, SPEC), ["learning.lr=3e-5", "seed=3", "model.base=foo@v2"])
    assert spec.learning.lr == 3e-5
    assert spec.seed == 3
    assert spec.model.base == "foo@v2" and isinstance(spec.model.base, ArtifactRef)


def test_overrides_do_not_change_their_input() -> None:
    data = {"learning": {"lr": 1e-5}}
    apply_overrides(data, ["learning.lr=2e-5"])
    assert data == {"learning": {"lr": 1e-5}}


def test_spec_hash_is_stable(tmp_path: Path) -> None:
    path = write(tmp_path, SPEC)
    first = load_spec(path).spec_hash()
    assert first.startswith("sha256:") and len(first) == len("sha256:") + 64
    assert load_spec(path).spec_hash() == first
    assert load_spec(write(tmp_path, SPEC_REORDERED, "reordered.toml")).spec_hash() == first
    assert load_spec(path, ["learning.lr=2e-5"]).spec_hash() != first
    # An override to the value the file already holds changes nothing.
    assert load_spec(path, ["learning.lr=1e-5"]).spec_hash() == first


def test_floating_label_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SPEC.replace('"base-model@v1"', '"base-model@latest"'))
    with pytest.raises(FloatingReferenceError) as caught:
        load_spec(path)
    error = caught.value
    assert isinstance(error, ValueError) and isinstance(error, ReprorlError)
    assert isinstance(error, SpecError)
    assert error.field == "model.base"
    assert str(error).startswith("model.base: ") and "latest" in str(error)


def test_floating_label_in_an_override_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FloatingReferenceError, match=r"^evaluation\.suites\[1\]: "):
        load_spec(write(tmp_path, SPEC), ['evaluation.suites=["suite-a@v1", "suite-b@main"]'])


def test_error_names_the_field_inside_a_tagged_union(tmp_path: Path) -> None:
    """Pydantic's location has the union tag (`model.adapter.lora.rank`); the message must not."""
    with pytest.raises(SpecError) as caught:
        load_spec(write(tmp_path, SPEC), ["model.adapter.kind=lora", "model.adapter.rank=0"])
    assert caught.value.field == "model.adapter.rank"


def test_non_finite_number_names_its_field(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(write(tmp_path, SPEC), ["evaluation.thresholds.success=inf"])
    assert caught.value.field == "evaluation.thresholds.success"


def test_iter_refs_finds_every_reference_with_its_path(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, SPEC))
    found = list(iter_refs(spec))
    assert dict(found) == REFS
    assert len(found) == len(REFS)
    assert all(isinstance(ref, ArtifactRef) for _, ref in found)


def test_resolve_spec_pins_every_reference(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, SPEC))
    assert not is_resolved(spec)
    with pytest.raises(SpecError, match=r"^model\.base: "):
        ensure_resolved(spec)
    pins = {ref: f"{ref.split('@')[0]}@{fake_hash(ref)}" for ref in REFS.values()}

    resolved = resolve_spec(spec, pins.__getitem__)

    assert isinstance(resolved, RunSpec)
    assert is_resolved(resolved)
    assert ensure_resolved(resolved) is resolved
    assert {path: str(ref) for path, ref in iter_refs(resolved)} == {
        path: pins[ref] for path, ref in REFS.items()
    }
    assert resolved.learning == spec.learning  # only references change
    assert resolved.spec_hash() != spec.spec_hash()
    assert resolve_spec(spec, pins.__getitem__).spec_hash() == resolved.spec_hash()
    assert validate_spec(resolved.model_dump(mode="json")) == resolved


@pytest.mark.parametrize("machine", ["float32", "bfloat16"])
def test_resolve_spec_pins_an_auto_precision_to_the_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, machine: str
) -> None:
    monkeypatch.setattr(hardware, "auto_dtype", lambda: (machine, "the test's machine"))
    spec = load_spec(write(tmp_path, SPEC), ["model.sampling_dtype=auto", "model.train_dtype=auto"])
    pins = {ref: f"{ref.split('@')[0]}@{fake_hash(ref)}" for ref in REFS.values()}
    pinned_refs_only = resolve_spec(load_spec(write(tmp_path, SPEC)), pins.__getitem__)
    half = pinned_refs_only.model_copy(
        update={"model": pinned_refs_only.model.model_copy(update={"train_dtype": "auto"})}
    )
    assert not is_resolved(half)
    with pytest.raises(SpecError, match=r"^model\.train_dtype: 'auto' is not pinned"):
        ensure_resolved(half)

    resolved = resolve_spec(spec, pins.__getitem__)

    assert (resolved.model.sampling_dtype, resolved.model.train_dtype) == (machine, machine)
    assert ensure_resolved(resolved) is resolved
    # A pinned precision stays as written, whatever the machine would pick.
    other = "float32" if machine == "bfloat16" else "bfloat16"
    spec = load_spec(write(tmp_path, SPEC), [f"model.sampling_dtype={other}"])
    assert resolve_spec(spec, pins.__getitem__).model.sampling_dtype == other


def test_resolve_spec_names_the_reference_it_cannot_pin(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, SPEC))
    pins = {ref: fake_hash(ref) for ref in REFS.values() if ref != "suite-b@v1"}
    with pytest.raises(SpecError) as caught:
        resolve_spec(spec, pins.__getitem__)
    assert caught.value.field == "evaluation.suites[1]"


def test_adapter_kind_defaults_to_lora_and_a_bom_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, SPEC)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    spec = load_spec(path, ["model.adapter.rank=4"])
    assert spec.model.adapter.kind == "lora"
    assert getattr(spec.model.adapter, "rank", None) == 4
    full = load_spec(path, ["model.adapter={kind='full'}"])
    assert full.model.adapter.kind == "full"
    with pytest.raises(SpecError, match=r"^model\.adapter: adapter kind must be 'lora' or 'full'"):
        load_spec(path, ["model.adapter.kind=qlora"])


def test_a_record_written_before_fields_without_effect_were_removed_still_loads(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, SPEC))
    old = spec.model_dump(mode="json")
    old["data"]["envs"] = []  # what every record of an older version holds: the default, no effect
    old["evaluation"]["metrics"] = ["success", "invalid_tool_calls", "extra_steps", "tokens"]
    assert stored_spec(old) == spec
    with pytest.raises(SpecError) as caught:
        validate_spec(old)  # a spec a person writes today: the key is unknown
    assert caught.value.field == "data.envs"
    old["data"]["envs"] = ["calc-env@v1"]
    with pytest.raises(SpecError) as caught:
        stored_spec(old)
    assert caught.value.field == "data.envs"
