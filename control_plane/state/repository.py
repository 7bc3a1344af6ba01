"""The control plane's state, read and written through one ``Repository``.

Design decisions:
- Callers get frozen dataclasses, never ORM objects: no session outlives a method, so the
  web layer and the reconciler cannot trigger lazy loads or hold transactions.
- Every write is one transaction; deployment changes log their event in the same one.
- Synchronous on purpose: async callers use ``asyncio.to_thread(repo.method, ...)``.
- Build the Engine with ``database.make_engine``: on SQLite it turns on the foreign keys
  that make ``delete_deployment`` cascade to the deployment's actors.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, NewType, TypeVar

from sqlalchemy import ColumnElement, Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from dynask.control_plane.state.deployment import (
    DeploymentSpec,
    Role,
    check_engine_args,
    check_replicas,
)
from dynask.control_plane.state.models import (
    ACTOR_STATUSES,
    ActorInstanceRow,
    Base,
    DeploymentRow,
    EventRow,
    utcnow,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ActorId = NewType("ActorId", int)
RecordT = TypeVar("RecordT", bound="DataclassInstance")


class DeploymentExistsError(ValueError):
    """A deployment of that name exists already."""


class DeploymentRejectedError(ValueError):
    """The database refused a deployment for another reason than its name (a constraint
    its schema has and this code does not know, e.g. an engine kind a database migrated
    by an older version does not list)."""


class NotFoundError(KeyError):
    """Base of the lookups that found nothing; ``str()`` is the plain message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DeploymentNotFoundError(NotFoundError):
    """No deployment has that name."""


class ActorNotFoundError(NotFoundError):
    """No actor instance has that id."""


@dataclass(frozen=True)
class Deployment:
    """A deployment as stored."""

    id: int
    name: str
    model: str
    engine: str
    role: Role
    replicas: int
    engine_args: dict[str, Any]
    served_model_name: str | None
    engine_file: str | None
    created_at: datetime
    updated_at: datetime

    def spec(self) -> DeploymentSpec:
        """What this deployment asks for (without its id and timestamps)."""
        return DeploymentSpec(
            name=self.name,
            model=self.model,
            engine=self.engine,
            role=self.role,
            replicas=self.replicas,
            engine_args=dict(self.engine_args),
            served_model_name=self.served_model_name,
            engine_file=self.engine_file,
        )


@dataclass(frozen=True)
class ActorInstance:
    """An engine actor of a deployment, placed on a worker."""

    id: ActorId
    deployment_name: str
    worker_address: str
    status: str
    stream_address: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Event:
    """One entry of the event log."""

    id: int
    at: datetime
    who: str
    kind: str
    subject: str
    details: dict[str, Any]


class Unchanged(enum.Enum):
    """Marks an ``update_actor`` argument that keeps its stored value (None clears)."""

    UNCHANGED = enum.auto()


UNCHANGED = Unchanged.UNCHANGED


def _record(kind: type[RecordT], row: Base, **values: Any) -> RecordT:
    """The frozen record ``kind`` made of ``row``'s same-named attributes and ``values``."""
    names = [f.name for f in fields(kind) if f.name not in values]
    return kind(**{name: getattr(row, name) for name in names}, **values)


def _spec_values(spec: DeploymentSpec) -> dict[str, Any]:
    values = {f.name: getattr(spec, f.name) for f in fields(spec)}
    return values | {"engine_args": dict(spec.engine_args), "role": spec.role.value}


def _deployment(row: DeploymentRow) -> Deployment:
    return _record(Deployment, row, role=Role(row.role))


def _check_actor_status(status: str) -> None:
    if status not in ACTOR_STATUSES:
        raise ValueError(
            f"Actor 'status' has value {status!r}; expected one of {', '.join(ACTOR_STATUSES)}"
        )


class Repository:
    """Deployments, actor instances and the event log over one Engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    # -- deployments -------------------------------------------------------------------

    def create_deployment(self, spec: DeploymentSpec, who: str) -> Deployment:
        """Stores a new deployment; DeploymentExistsError if the name is taken."""
        exists = DeploymentExistsError(
            f"Deployment {spec.name!r} already exists; pick another name or scale it"
        )
        try:
            with self._sessions.begin() as session:
                if _find_deployment(session, spec.name) is not None:
                    raise exists
                now = utcnow()
                row = DeploymentRow(**_spec_values(spec), created_at=now, updated_at=now)
                session.add(row)
                session.flush()
                _add_event(session, who, "deployment.created", spec.name, _spec_values(spec))
                return _deployment(row)
        except IntegrityError as error:
            if self.get_deployment(spec.name) is not None:  # a concurrent create won the race
                raise exists from error
            raise DeploymentRejectedError(
                f"the database refused deployment {spec.name!r}: " + str(error.orig).splitlines()[0]
            ) from error

    def get_deployment(self, name: str) -> Deployment | None:
        """The deployment called ``name``, or None."""
        with self._sessions.begin() as session:
            row = _find_deployment(session, name)
            return None if row is None else _deployment(row)

    def list_deployments(self) -> list[Deployment]:
        """All deployments, by name."""
        with self._sessions.begin() as session:
            rows = session.scalars(select(DeploymentRow).order_by(DeploymentRow.name))
            return [_deployment(row) for row in rows]

    def scale_deployment(self, name: str, replicas: int, who: str) -> Deployment:
        """Sets the desired number of replicas of ``name``."""
        check_replicas(replicas)
        with self._sessions.begin() as session:
            row = _get_deployment(session, name)
            details = {"from": row.replicas, "to": replicas}
            row.replicas, row.updated_at = replicas, utcnow()
            _add_event(session, who, "deployment.scaled", name, details)
            return _deployment(row)

    def update_engine_args(self, name: str, args: Mapping[str, Any], who: str) -> Deployment:
        """Replaces the engine arguments of ``name``."""
        check_engine_args(args)
        with self._sessions.begin() as session:
            row = _get_deployment(session, name)
            row.engine_args, row.updated_at = dict(args), utcnow()
            _add_event(session, who, "deployment.updated", name, {"engine_args": dict(args)})
            return _deployment(row)

    def delete_deployment(self, name: str, who: str) -> None:
        """Deletes ``name`` and (by ON DELETE CASCADE) its actor instances."""
        with self._sessions.begin() as session:
            row = _get_deployment(session, name)
            session.delete(row)
            _add_event(session, who, "deployment.deleted", name, {})

    # -- actor instances ---------------------------------------------------------------

    def add_actor(
        self, deployment_name: str, worker_address: str, status: str = "starting"
    ) -> ActorInstance:
        """Records a new actor of ``deployment_name`` placed on ``worker_address``."""
        _check_actor_status(status)
        with self._sessions.begin() as session:
            deployment = _get_deployment(session, deployment_name)
            now = utcnow()
            row = ActorInstanceRow(
                deployment_id=deployment.id,
                worker_address=worker_address,
                status=status,
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            session.flush()
            return _record(ActorInstance, row, deployment_name=deployment_name)

    def update_actor(
        self,
        actor_id: ActorId,
        *,
        status: str | Unchanged = UNCHANGED,
        stream_address: str | Unchanged | None = UNCHANGED,
        error: str | Unchanged | None = UNCHANGED,
    ) -> ActorInstance:
        """Changes the given fields of actor ``actor_id``; the others keep their values."""
        if not isinstance(status, Unchanged):
            _check_actor_status(status)
        with self._sessions.begin() as session:
            found = _actor_rows(session, ActorInstanceRow.id == actor_id)
            if not found:
                raise ActorNotFoundError(f"Actor instance {actor_id} is not known")
            [(row, deployment_name)] = found
            changes = {"status": status, "stream_address": stream_address, "error": error}
            for column, value in changes.items():
                if value is not UNCHANGED:
                    setattr(row, column, value)
            row.updated_at = utcnow()
            return _record(ActorInstance, row, deployment_name=deployment_name)

    def close_stale_actors(self, who: str, reason: str) -> int:
        """Marks every ``starting``/``ready`` actor row ``lost`` with ``reason`` (a control
        plane starting: rows its predecessor left when it was killed; the actors still
        running are recorded again as it adopts them). Returns how many rows changed."""
        with self._sessions.begin() as session:
            rows = session.scalars(
                select(ActorInstanceRow).where(ActorInstanceRow.status.in_(("starting", "ready")))
            ).all()
            now = utcnow()
            for row in rows:
                row.status, row.error, row.updated_at = "lost", reason, now
            if rows:
                details = {"actors": len(rows), "reason": reason}
                _add_event(session, who, "actor.stale_closed", "actors", details)
            return len(rows)

    def list_actors(self, deployment_name: str | None = None) -> list[ActorInstance]:
        """Actor instances in creation order, of one deployment or of all."""
        criteria = [] if deployment_name is None else [DeploymentRow.name == deployment_name]
        with self._sessions.begin() as session:
            rows = _actor_rows(session, *criteria)
            return [_record(ActorInstance, row, deployment_name=name) for row, name in rows]

    # -- events ------------------------------------------------------------------------

    def log_event(self, who: str, kind: str, subject: str, details: Mapping[str, Any]) -> Event:
        """Appends an event (e.g. ``("reconciler", "actor.lost", "smollm", {...})``)."""
        with self._sessions.begin() as session:
            return _record(Event, _add_event(session, who, kind, subject, details))

    def recent_events(self, limit: int = 50) -> list[Event]:
        """The latest ``limit`` events, newest first."""
        query = select(EventRow).order_by(EventRow.id.desc()).limit(limit)
        with self._sessions.begin() as session:
            return [_record(Event, row) for row in session.scalars(query)]


def _actor_rows(
    session: Session, *criteria: ColumnElement[bool]
) -> list[tuple[ActorInstanceRow, str]]:
    """Actor rows with their deployment's name, in creation order."""
    query = select(ActorInstanceRow, DeploymentRow.name).join(DeploymentRow).where(*criteria)
    return [(row, name) for row, name in session.execute(query.order_by(ActorInstanceRow.id))]


def _find_deployment(session: Session, name: str) -> DeploymentRow | None:
    return session.scalar(select(DeploymentRow).where(DeploymentRow.name == name))


def _get_deployment(session: Session, name: str) -> DeploymentRow:
    row = _find_deployment(session, name)
    if row is None:
        raise DeploymentNotFoundError(f"Deployment {name!r} does not exist")
    return row


def _add_event(
    session: Session, who: str, kind: str, subject: str, details: Mapping[str, Any]
) -> EventRow:
    row = EventRow(at=utcnow(), who=who, kind=kind, subject=subject, details=dict(details))
    session.add(row)
    session.flush()
    return row
