"""The registry: artifact names → versions → content hashes, lineage edges, and the run index.

It is a SQL database reached through SQLAlchemy: SQLite under the store root by default, or any
PostgreSQL URL. Versions are assigned per name in registration order (`v1`, `v2`, ...) and never
change; a version always points at one content hash.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from reprorl.errors import (
    AmbiguousReferenceError,
    ArtifactNotFoundError,
    RegistryError,
    RunNotFoundError,
)
from reprorl.hashing import HASH_PREFIX

ARTIFACT_KINDS = ("file", "tree", "taskset", "model", "adapter", "env", "suite", "spec", "tools")
_RETRIES = 5
# How long a connection to a database server that is down is tried again before the registry fails.
RECONNECT_S = 60.0


class _Base(DeclarativeBase):
    pass


class ArtifactRow(_Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_artifact_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(71), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class LineageRow(_Base):
    __tablename__ = "lineage"

    child: Mapped[str] = mapped_column(String(71), primary_key=True)
    parent: Mapped[str] = mapped_column(String(71), primary_key=True)
    relation: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Part of the key: two runs that make the same bytes from the same parent each record their edge.
    # "" when no run made it (a person linked it).
    run_id: Mapped[str] = mapped_column(String(64), primary_key=True, default="")


class RunRow(_Base):
    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    spec_hash: Mapped[str] = mapped_column(String(71), index=True)
    status: Mapped[str] = mapped_column(String(16))
    path: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class RunArtifactRow(_Base):
    """Which artifacts a run used or produced (its inputs and outputs)."""

    __tablename__ = "run_artifacts"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"), primary_key=True)
    hash: Mapped[str] = mapped_column(String(71), primary_key=True)
    role: Mapped[str] = mapped_column(String(64), primary_key=True)


@dataclass(frozen=True)
class ArtifactVersion:
    """One registered version of a named artifact."""

    name: str
    version: int
    hash: str
    kind: str
    size: int
    created_at: datetime
    meta: dict[str, Any]

    @property
    def ref(self) -> str:
        """The pinned reference a run spec stores: `name@sha256:<hex>`."""
        return f"{self.name}@{self.hash}"

    @property
    def label(self) -> str:
        return f"{self.name}@v{self.version}"

    @classmethod
    def of(cls, row: ArtifactRow) -> ArtifactVersion:
        created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
        return cls(row.name, row.version, row.hash, row.kind, row.size, created, dict(row.meta))


@dataclass(frozen=True)
class RunEntry:
    run_id: str
    name: str
    spec_hash: str
    status: str
    path: str
    created_at: datetime
    ended_at: datetime | None


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    engine = create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})

    reached = False

    @event.listens_for(engine, "do_connect")
    def _reconnect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        # A database server that restarts (a failover, an upgrade) refuses connections for a
        # while: once it has been reached, a run that needs the registry waits for it, up to
        # RECONNECT_S, instead of failing. A server never reached (a wrong URL) fails at once.
        # Stale pooled connections are replaced by the pre-ping.
        nonlocal reached
        deadline = time.monotonic() + (RECONNECT_S if reached else 0.0)
        delay = 0.25
        while True:
            try:
                connection = dialect.connect(*cargs, **cparams)
                reached = True
                return connection
            except dialect.loaded_dbapi.OperationalError:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    return engine


class Registry:
    """Names, versions, lineage and runs in one SQL database."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self.engine = make_engine(url)
            _Base.metadata.create_all(self.engine)
        except sa_exc.SQLAlchemyError as exc:
            raise RegistryError(f"cannot open registry {self.safe_url}: {_short(exc)}") from None

    @property
    def safe_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True) if hasattr(self, "engine") else self.url

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        try:
            with Session(self.engine, expire_on_commit=False) as session, session.begin():
                yield session
        except sa_exc.IntegrityError:
            raise
        except sa_exc.SQLAlchemyError as exc:
            raise RegistryError(f"registry {self.safe_url}: {_short(exc)}") from None

    # -- artifacts -----------------------------------------------------------------------------

    def register(
        self, name: str, address: str, *, kind: str, size: int, meta: dict[str, Any] | None = None
    ) -> ArtifactVersion:
        """Record `address` as the newest version of `name`; unchanged content keeps its version.

        Unless another run made it: the same bytes from a different run (`meta["run_id"]`) are a new
        version with that run's metadata, so each run's record finds what it registered.
        """
        for _ in range(_RETRIES):
            try:
                with self.session() as s:
                    newest = s.scalars(
                        select(ArtifactRow)
                        .where(ArtifactRow.name == name)
                        .order_by(ArtifactRow.version.desc())
                        .limit(1)
                    ).first()
                    producer = (meta or {}).get("run_id")
                    if (
                        newest is not None
                        and newest.hash == address
                        and (producer is None or newest.meta.get("run_id") == producer)
                    ):
                        return ArtifactVersion.of(newest)
                    row = ArtifactRow(
                        name=name,
                        version=(newest.version + 1) if newest else 1,
                        hash=address,
                        kind=kind,
                        size=size,
                        created_at=datetime.now(UTC),
                        meta=json.loads(json.dumps(meta or {})),
                    )
                    s.add(row)
                    s.flush()
                    return ArtifactVersion.of(row)
            except sa_exc.IntegrityError:
                continue  # another writer took this version number; read again and retry
        raise RegistryError(f"could not register {name}: too many concurrent registrations")

    def adopt(self, version: ArtifactVersion) -> ArtifactVersion | None:
        """Register `version` under its own number, as another store had it (an imported run's
        artifact); None when that number of that name is taken here by other content."""
        with self.session() as s:
            row = s.scalars(
                select(ArtifactRow).where(
                    ArtifactRow.name == version.name, ArtifactRow.version == version.version
                )
            ).first()
            if row is not None:
                return ArtifactVersion.of(row) if row.hash == version.hash else None
        try:
            with self.session() as s:
                row = ArtifactRow(
                    name=version.name,
                    version=version.version,
                    hash=version.hash,
                    kind=version.kind,
                    size=version.size,
                    created_at=version.created_at,
                    meta=json.loads(json.dumps(version.meta)),
                )
                s.add(row)
                s.flush()
                return ArtifactVersion.of(row)
        except sa_exc.IntegrityError:
            return None  # another writer took the number first

    def versions(self, name: str | None = None) -> list[ArtifactVersion]:
        query = select(ArtifactRow).order_by(ArtifactRow.name, ArtifactRow.version)
        if name is not None:
            query = query.where(ArtifactRow.name == name)
        with self.session() as s:
            return [ArtifactVersion.of(r) for r in s.scalars(query)]

    def newest(self, name: str) -> ArtifactVersion:
        found = self.versions(name)
        if not found:
            raise ArtifactNotFoundError(f"no artifact named {name!r} is registered")
        return found[-1]

    def lookup(
        self, name: str | None, *, seq: int | None = None, digest: str | None = None
    ) -> ArtifactVersion:
        """Find one version by number or by (a prefix of) its hash."""
        query = select(ArtifactRow)
        if name is not None:
            query = query.where(ArtifactRow.name == name)
        if seq is not None:
            query = query.where(ArtifactRow.version == seq)
        if digest is not None:
            query = query.where(ArtifactRow.hash.startswith(HASH_PREFIX + digest))
        with self.session() as s:
            rows = list(s.scalars(query.order_by(ArtifactRow.version.desc())))
        what = f"{name}@" if name else ""
        what += f"v{seq}" if seq is not None else f"{HASH_PREFIX}{digest}"
        if not rows:
            raise ArtifactNotFoundError(f"{what} is not registered in {self.safe_url}")
        if len({r.hash for r in rows}) > 1:
            raise AmbiguousReferenceError(f"{what} matches {len(rows)} artifacts; give more hex digits")
        return ArtifactVersion.of(rows[0])

    # -- lineage -------------------------------------------------------------------------------

    def link(self, child: str, parent: str, relation: str, run_id: str | None = None) -> None:
        """Record that `child` was made from `parent` (e.g. adapter ← base model)."""
        try:
            with self.session() as s:
                if s.get(LineageRow, (child, parent, relation, run_id or "")) is None:
                    s.add(LineageRow(child=child, parent=parent, relation=relation, run_id=run_id or ""))
        except sa_exc.IntegrityError:
            pass  # a concurrent writer recorded the same edge first

    def parents(self, child: str) -> list[tuple[str, str, str | None]]:
        with self.session() as s:
            rows = s.scalars(select(LineageRow).where(LineageRow.child == child))
            return [
                (p, rel, run or None)
                for p, rel, run in sorted((r.parent, r.relation, r.run_id) for r in rows)
            ]

    def children(self, parent: str) -> list[tuple[str, str, str | None]]:
        with self.session() as s:
            rows = s.scalars(select(LineageRow).where(LineageRow.parent == parent))
            return [
                (c, rel, run or None) for c, rel, run in sorted((r.child, r.relation, r.run_id) for r in rows)
            ]

    def made_by_run(self, run_id: str) -> list[tuple[str, str, str]]:
        """(child, parent, relation) of every lineage edge a run recorded."""
        with self.session() as s:
            rows = s.scalars(select(LineageRow).where(LineageRow.run_id == run_id))
            return sorted((r.child, r.parent, r.relation) for r in rows)

    # -- runs ----------------------------------------------------------------------------------

    def add_run(self, entry: RunEntry, inputs: dict[str, str]) -> None:
        try:
            with self.session() as s:
                s.add(RunRow(**entry.__dict__))
                s.flush()
                for role, address in sorted(inputs.items()):
                    s.add(RunArtifactRow(run_id=entry.run_id, hash=address, role=role))
        except sa_exc.IntegrityError:
            raise RegistryError(f"run {entry.run_id} is already in the registry") from None

    def has_run(self, run_id: str) -> bool:
        with self.session() as s:
            return s.get(RunRow, run_id) is not None

    def set_run_status(self, run_id: str, status: str, ended_at: datetime | None) -> None:
        with self.session() as s:
            row = s.get(RunRow, run_id)
            if row is None:
                raise RunNotFoundError(f"run {run_id} is not in the registry")
            row.status = status
            row.ended_at = ended_at

    def runs(self, limit: int | None = None) -> list[RunEntry]:
        query = select(RunRow).order_by(RunRow.run_id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self.session() as s:
            return [_run_entry(r) for r in s.scalars(query)]

    def run_artifacts(self, run_id: str) -> dict[str, str]:
        with self.session() as s:
            rows = s.scalars(select(RunArtifactRow).where(RunArtifactRow.run_id == run_id))
            return {r.role: r.hash for r in rows}

    def runs_using(self, address: str) -> list[tuple[str, str]]:
        """(run id, role) of every run that recorded `address` among its inputs or outputs."""
        with self.session() as s:
            rows = s.scalars(select(RunArtifactRow).where(RunArtifactRow.hash == address))
            return sorted((r.run_id, r.role) for r in rows)

    def count(self) -> int:
        with self.session() as s:
            return int(s.scalar(select(func.count()).select_from(ArtifactRow)) or 0)


def _run_entry(row: RunRow) -> RunEntry:
    def aware(value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    created = aware(row.created_at)
    assert created is not None
    return RunEntry(row.run_id, row.name, row.spec_hash, row.status, row.path, created, aware(row.ended_at))


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200]
