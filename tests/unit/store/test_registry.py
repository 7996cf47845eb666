"""The registry on real SQLite and PostgreSQL: versions, lookups, lineage, runs, concurrency."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reprorl.errors import (
    AmbiguousReferenceError,
    ArtifactNotFoundError,
    IntegrityError,
    NotFoundError,
    UserInputError,
)
from reprorl.store import Registry, RunEntry, Store

# Two contents whose sha256 digests share the first 8 hex digits (found by a birthday search);
# 8 digits is the shortest prefix a reference may use, so these make an ambiguous reference.
TWIN_A = b"prefix-twin-70859"
TWIN_B = b"prefix-twin-74533"
TWIN_PREFIX = "632e780e"


def addr(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def registry(registry_url: str) -> Iterator[Registry]:
    reg = Registry(registry_url)
    try:
        yield reg
    finally:
        reg.close()


@pytest.fixture
def store(tmp_path: Path, registry_url: str) -> Iterator[Store]:
    st = Store(root=tmp_path / "home", db_url=registry_url)
    try:
        yield st
    finally:
        st.close()


def test_twin_contents_share_a_prefix() -> None:
    a, b = addr(TWIN_A), addr(TWIN_B)
    assert a != b
    assert a.startswith("sha256:" + TWIN_PREFIX)
    assert b.startswith("sha256:" + TWIN_PREFIX)


# -- versions --------------------------------------------------------------------------------------


def test_versions_follow_registration_order(registry: Registry) -> None:
    h1, h2 = addr(b"one"), addr(b"two")

    v1 = registry.register("calc-train", h1, kind="taskset", size=3, meta={"tasks": 2})
    assert (v1.name, v1.version, v1.hash, v1.kind, v1.size) == ("calc-train", 1, h1, "taskset", 3)
    assert v1.meta == {"tasks": 2}
    assert v1.label == "calc-train@v1"
    assert v1.ref == f"calc-train@{h1}"
    assert v1.created_at.tzinfo is not None

    again = registry.register("calc-train", h1, kind="taskset", size=3, meta={"tasks": 99})
    assert again == v1  # every field, including created_at and the original meta
    assert [v.version for v in registry.versions("calc-train")] == [1]

    v2 = registry.register("calc-train", h2, kind="taskset", size=3)
    assert (v2.version, v2.hash) == (2, h2)
    assert v2.created_at >= v1.created_at

    # Content going back to what v1 was is a new registration: v3, and it is the newest.
    v3 = registry.register("calc-train", h1, kind="taskset", size=3)
    assert (v3.version, v3.hash) == (3, h1)
    assert registry.newest("calc-train") == v3
    assert [(v.version, v.hash) for v in registry.versions("calc-train")] == [(1, h1), (2, h2), (3, h1)]

    # Registering the newest content again keeps v3 (it does not fall back to v1).
    assert registry.register("calc-train", h1, kind="taskset", size=3) == v3
    assert registry.count() == 3


def test_names_are_versioned_independently(registry: Registry) -> None:
    h = addr(b"shared")
    a = registry.register("a", h, kind="file", size=6)
    b = registry.register("b", h, kind="file", size=6)
    c = registry.register("a", addr(b"other"), kind="file", size=5)
    assert (a.version, b.version, c.version) == (1, 1, 2)
    assert [v.name for v in registry.versions()] == ["a", "a", "b"]
    assert registry.newest("b") == b


def test_lookup_by_seq_digest_and_prefix(registry: Registry) -> None:
    h1, h2 = addr(b"one"), addr(b"two")
    v1 = registry.register("m", h1, kind="model", size=3)
    v2 = registry.register("m", h2, kind="model", size=3)
    registry.register("other", addr(b"three"), kind="file", size=5)

    assert registry.lookup("m", seq=1) == v1
    assert registry.lookup("m", seq=2) == v2
    assert registry.lookup("m", digest=h2.removeprefix("sha256:")) == v2
    assert registry.lookup("m", digest=h1.removeprefix("sha256:")[:8]) == v1
    # Without a name, a hash prefix is searched across every name.
    assert registry.lookup(None, digest=h2.removeprefix("sha256:")[:12]) == v2


def test_lookup_digest_of_reverted_content_gives_newest_version(registry: Registry) -> None:
    h1, h2 = addr(b"one"), addr(b"two")
    registry.register("m", h1, kind="model", size=3)
    registry.register("m", h2, kind="model", size=3)
    v3 = registry.register("m", h1, kind="model", size=3)
    # Two versions hold this hash, but it is one hash, so the reference is not ambiguous.
    assert registry.lookup("m", digest=h1.removeprefix("sha256:")) == v3


def test_ambiguous_prefix_raises(registry: Registry) -> None:
    registry.register("twins", addr(TWIN_A), kind="file", size=len(TWIN_A))
    registry.register("twins", addr(TWIN_B), kind="file", size=len(TWIN_B))
    with pytest.raises(AmbiguousReferenceError, match="more hex digits") as info:
        registry.lookup("twins", digest=TWIN_PREFIX)
    assert isinstance(info.value, UserInputError)
    # One more digit tells them apart.
    longer = addr(TWIN_B).removeprefix("sha256:")[:9]
    assert registry.lookup("twins", digest=longer).hash == addr(TWIN_B)


def test_ambiguous_prefix_across_names(registry: Registry) -> None:
    registry.register("x", addr(TWIN_A), kind="file", size=len(TWIN_A))
    registry.register("y", addr(TWIN_B), kind="file", size=len(TWIN_B))
    assert registry.lookup("x", digest=TWIN_PREFIX).hash == addr(TWIN_A)
    with pytest.raises(AmbiguousReferenceError):
        registry.lookup(None, digest=TWIN_PREFIX)


def test_missing_raises_not_found_which_is_a_key_error(registry: Registry) -> None:
    registry.register("m", addr(b"one"), kind="model", size=3)
    cases = [
        lambda: registry.lookup("nope", seq=1),
        lambda: registry.lookup("m", seq=2),
        lambda: registry.lookup("m", digest="deadbeef"),
        lambda: registry.lookup(None, digest="deadbeefdeadbeef"),
        lambda: registry.newest("nope"),
    ]
    for case in cases:
        with pytest.raises(ArtifactNotFoundError) as info:
            case()
        assert isinstance(info.value, KeyError)
        assert isinstance(info.value, NotFoundError)
        assert "'" not in str(info.value)[:1]  # read plainly, not KeyError's quoted repr


# -- lineage ---------------------------------------------------------------------------------------


def test_lineage_links_parents_and_children(registry: Registry) -> None:
    base, adapter, data = addr(b"base"), addr(b"adapter"), addr(b"data")
    registry.link(adapter, base, "finetuned_from", run_id="run-1")
    registry.link(adapter, data, "trained_on", run_id="run-1")

    assert registry.parents(adapter) == sorted(
        [(base, "finetuned_from", "run-1"), (data, "trained_on", "run-1")]
    )
    assert registry.children(base) == [(adapter, "finetuned_from", "run-1")]
    assert registry.children(data) == [(adapter, "trained_on", "run-1")]
    assert registry.parents(base) == []
    assert registry.children(adapter) == []


def test_link_is_idempotent(registry: Registry) -> None:
    child, parent = addr(b"child"), addr(b"parent")
    registry.link(child, parent, "derived_from", run_id="run-1")
    registry.link(child, parent, "derived_from", run_id="run-1")
    assert registry.parents(child) == [(parent, "derived_from", "run-1")]
    registry.link(child, parent, "derived_from", run_id="run-2")  # another run made the same bytes
    registry.link(child, parent, "evaluated_with")  # another relation is another edge
    assert registry.parents(child) == [
        (parent, "derived_from", "run-1"),
        (parent, "derived_from", "run-2"),
        (parent, "evaluated_with", None),
    ]


def test_the_same_bytes_from_another_run_are_a_new_version_with_that_runs_metadata(
    registry: Registry,
) -> None:
    blob = addr(b"adapter")
    one = registry.register("a-adapter", blob, kind="adapter", size=1, meta={"run_id": "run-1", "lr": 1})
    again = registry.register("a-adapter", blob, kind="adapter", size=1, meta={"run_id": "run-1", "lr": 1})
    assert again.version == one.version == 1  # the same run registering again (a resumed finish)
    two = registry.register("a-adapter", blob, kind="adapter", size=1, meta={"run_id": "run-2", "lr": 2})
    assert (two.version, two.hash, two.meta["lr"]) == (2, blob, 2)
    plain = registry.register("a-set", blob, kind="file", size=1, meta={"source_name": "x"})
    assert registry.register("a-set", blob, kind="file", size=1, meta={"source_name": "y"}) == plain


# -- runs ------------------------------------------------------------------------------------------


def _entry(run_id: str, when: datetime, name: str = "demo") -> RunEntry:
    return RunEntry(run_id, name, addr(run_id.encode()), "created", f"/runs/{run_id}", when, None)


def test_runs_add_list_status_and_artifacts(registry: Registry) -> None:
    t0 = datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    first = _entry("20250102T030405123456Z-aaaaaa", t0)
    second = _entry("20250102T030406000000Z-bbbbbb", t0 + timedelta(seconds=1), name="other")
    registry.add_run(first, {"tasks": addr(b"tasks"), "model": addr(b"model")})
    registry.add_run(second, {})

    listed = registry.runs()
    assert [r.run_id for r in listed] == [second.run_id, first.run_id]  # newest first
    assert listed[1] == first  # every field survives the round trip, created_at tz-aware
    assert registry.runs(limit=1) == [second]

    assert registry.run_artifacts(first.run_id) == {"tasks": addr(b"tasks"), "model": addr(b"model")}
    assert registry.run_artifacts(second.run_id) == {}

    registry.set_run_status(first.run_id, "running", None)
    assert registry.runs()[1].status == "running"
    ended = t0 + timedelta(minutes=5)
    registry.set_run_status(first.run_id, "succeeded", ended)
    row = next(r for r in registry.runs() if r.run_id == first.run_id)
    assert (row.status, row.ended_at) == ("succeeded", ended)
    assert next(r for r in registry.runs() if r.run_id == second.run_id).status == "created"

    with pytest.raises(NotFoundError):
        registry.set_run_status("no-such-run", "failed", ended)


# -- concurrency -----------------------------------------------------------------------------------


def _register_concurrently(registries: list[Registry], name: str) -> list[int]:
    barrier = threading.Barrier(len(registries))
    results: dict[int, int] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            version = registries[i].register(name, addr(f"{name}-{i}".encode()), kind="file", size=i)
            results[i] = version.version
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(registries))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a registration hung"
    assert errors == []
    return [results[i] for i in range(len(registries))]


def test_concurrent_registration_shared_registry(registry: Registry) -> None:
    for round_ in range(3):
        name = f"race-{round_}"
        got = _register_concurrently([registry] * 4, name)
        assert sorted(got) == [1, 2, 3, 4]
        stored = registry.versions(name)
        assert [v.version for v in stored] == [1, 2, 3, 4]
        assert len({v.hash for v in stored}) == 4
        # Each thread's version points at the hash that thread registered.
        for i, version in enumerate(got):
            assert registry.lookup(name, seq=version).hash == addr(f"{name}-{i}".encode())


def test_concurrent_registration_separate_connections(registry: Registry, registry_url: str) -> None:
    others = [Registry(registry_url) for _ in range(4)]  # like four processes, one engine each
    try:
        for round_ in range(3):
            name = f"race-{round_}"
            got = _register_concurrently(others, name)
            assert sorted(got) == [1, 2, 3, 4]
            assert [v.version for v in registry.versions(name)] == [1, 2, 3, 4]
    finally:
        for other in others:
            other.close()


# -- the store on top of the registry --------------------------------------------------------------


def test_store_add_resolve_read(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "calc-train.jsonl"
    src.write_bytes(b"first\n")
    v1 = store.add("calc-train", src)
    src.write_bytes(b"second\n")
    v2 = store.add("calc-train", src)
    src.write_bytes(b"first\n")
    v3 = store.add("calc-train", src)
    assert [v1.version, v2.version, v3.version] == [1, 2, 3]
    assert v1.hash == v3.hash == addr(b"first\n")
    assert v1.meta == {"source_name": "calc-train.jsonl"}
    assert v1.kind == "file"

    assert store.read("calc-train@v2") == b"second\n"
    assert store.read("calc-train@v3") == b"first\n"
    assert store.resolve("calc-train@v1").pinned == f"calc-train@{v1.hash}"
    assert store.resolve(f"calc-train@{v2.hash.removeprefix('sha256:')[:10]}").version == v2
    assert store.pin_newest("calc-train") == f"calc-train@{v1.hash}"
    # A bare full hash resolves and finds the newest version that holds it.
    bare = store.resolve(v2.hash)
    assert (bare.hash, bare.version) == (v2.hash, v2)


def test_store_ambiguous_and_missing(store: Store) -> None:
    store.add_bytes("twins", TWIN_A, kind="file")
    store.add_bytes("twins", TWIN_B, kind="file")
    with pytest.raises(AmbiguousReferenceError):
        store.resolve(f"twins@{TWIN_PREFIX}")
    with pytest.raises(ArtifactNotFoundError):
        store.resolve("twins@v3")
    with pytest.raises(ArtifactNotFoundError):
        store.resolve("nobody@v1")
    with pytest.raises(KeyError):
        store.read("nobody@v1")


def test_store_read_names_the_version_on_corruption(store: Store) -> None:
    v1 = store.add_bytes("calc-train", b"payload bytes", kind="file")
    obj = store.blobs._path(v1.hash)
    obj.chmod(0o644)
    obj.write_bytes(b"payload bytez")
    with pytest.raises(IntegrityError, match="calc-train@v1") as info:
        store.read("calc-train@v1")
    assert info.value.artifact == "calc-train@v1"
    assert info.value.expected == v1.hash
    assert info.value.actual == addr(b"payload bytez")
