"""SQLAlchemy models of the control plane's state: deployments, actors, events,
admin users, API keys, workers on other hosts.

Design decisions:
- The schema is created only by the Alembic migrations in ``migrations/``; these models
  mirror them for queries, and a test checks that the two agree (``compare_metadata``).
- Timestamps are timezone-aware UTC on every backend: SQLite keeps no zone, so
  ``UTCDateTime`` refuses naive values on the way in and marks values UTC on the way out.
- Allowed values of the enum-like string columns live here as tuples, shared by the
  repository's validation and the CHECK constraints.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from dynask.control_plane.state.deployment import ENGINES, ROLES

ACTOR_STATUSES = ("starting", "ready", "failed", "stopped", "lost")
# What a remote worker's stored row may say (``retiring`` and ``retired`` are never stored:
# retiring removes the row).
REMOTE_WORKER_STATES = ("starting", "joined", "failed", "exited")

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


def one_of(column: str, values: tuple[str, ...]) -> str:
    """A CHECK constraint's SQL text: ``column IN ('a', 'b')``."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class UTCDateTime(TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that always stores and returns aware UTC datetimes."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"Timestamp has value {value!r}; expected a timezone-aware one")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:  # SQLite stores no zone; we only ever write UTC
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base with deterministic constraint names (they appear in migrations)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[dict[str, Any]]: JSON(),
    }


class DeploymentRow(Base):
    """A model served by ``replicas`` engine actors (desired state)."""

    __tablename__ = "deployments"
    __table_args__ = (
        CheckConstraint("replicas >= 0", name="replicas_non_negative"),
        CheckConstraint(one_of("engine", ENGINES), name="engine_known"),
        CheckConstraint(one_of("role", ROLES), name="role_known"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    model: Mapped[str] = mapped_column(String(1024))
    engine: Mapped[str] = mapped_column(String(16))
    role: Mapped[str] = mapped_column(String(16))
    replicas: Mapped[int] = mapped_column(Integer)
    engine_args: Mapped[dict[str, Any]]
    served_model_name: Mapped[str | None] = mapped_column(String(255))
    engine_file: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ActorInstanceRow(Base):
    """One engine actor of a deployment, placed on a worker (observed state)."""

    __tablename__ = "actor_instances"
    __table_args__ = (CheckConstraint(one_of("status", ACTOR_STATUSES), name="status_known"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE"), index=True
    )
    worker_address: Mapped[str] = mapped_column(String(255), index=True)
    status: Mapped[str] = mapped_column(String(16))
    stream_address: Mapped[str | None] = mapped_column(String(255))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class EventRow(Base):
    """One entry of the audit log: who did what to which subject, and when."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    who: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(255))
    details: Mapped[dict[str, Any]]


class AdminUserRow(Base):
    """An account of the admin UI; the password is stored as a salted scrypt hash."""

    __tablename__ = "admin_users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_login_at: Mapped[datetime | None]


class ApiKeyRow(Base):
    """A key of the OpenAI API: only its SHA-256 is stored, and a prefix to recognise it."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    # The key's tenant limits (None: no limit) and priority class (``api_keys.TenantLimits``).
    requests_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_concurrent: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    priority: Mapped[str] = mapped_column(String(16), default="normal", server_default="normal")


class GraphRow(Base):
    """An inference graph served by ``dynask serve MODULE:Component -f CONFIG.yaml``."""

    __tablename__ = "graphs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    target: Mapped[str] = mapped_column(String(1024))
    description: Mapped[dict[str, Any]]  # components and links (Graph.describe)
    config: Mapped[dict[str, Any]]  # each component's merged settings
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ResponseRow(Base):
    """A response of the Responses API kept for ``previous_response_id`` (``store: true``)."""

    __tablename__ = "responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(255))
    previous_response_id: Mapped[str | None] = mapped_column(String(64))
    conversation: Mapped[list[dict[str, Any]]]  # chat messages, this response's output last
    body: Mapped[dict[str, Any]]  # the response object as the API returned it
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class RemoteWorkerRow(Base):
    """A ``dask worker`` the admin UI started on another host over SSH: kept so that a
    restarted control plane starts it again (its process ended with the old connection)."""

    __tablename__ = "remote_workers"
    __table_args__ = (
        CheckConstraint(one_of("state", REMOTE_WORKER_STATES), name="state_known"),
        CheckConstraint("port >= 1 AND port <= 65535", name="port_in_range"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)  # its Dask worker name
    launch: Mapped[int] = mapped_column(Integer, index=True)  # the add it came from
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    ssh_user: Mapped[str] = mapped_column(String(64))
    gpu: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: a CPU worker
    environment: Mapped[str] = mapped_column(String(1024))
    state: Mapped[str] = mapped_column(String(16))
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    who: Mapped[str] = mapped_column(String(64))  # who added it
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    joined_at: Mapped[datetime | None] = mapped_column(nullable=True)  # its latest join
