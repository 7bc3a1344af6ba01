"""Workers on other hosts as stored: one row per ``dask worker`` the admin UI started.

A row keeps what is needed to start the worker again (host, SSH port and user, its GPU,
the environment, its Dask name), its last state (``starting``, ``joined``, ``failed``,
``exited``), the last error and when it was added, changed and last joined. Retiring a
worker deletes its row. Blocking calls: ``RemoteWorkers`` runs them in a worker thread.

Design decisions:
- A row is one worker, not one add: each worker has a state of its own (one GPU's worker
  may fail while the others join) and is retired alone. The workers of one add share
  ``launch`` (the serial in their names), so they are started again over one connection.
- ``next_launch`` counts on from the largest launch stored, so a name is never given to
  two rows; a launch whose rows were all retired may be given again (its processes ended).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import sessionmaker

from dynask.control_plane.state.models import REMOTE_WORKER_STATES, RemoteWorkerRow, utcnow


@dataclass(frozen=True)
class RemoteWorkerRecord:
    """A remote worker as stored."""

    id: int
    name: str
    launch: int
    host: str
    port: int
    ssh_user: str
    gpu: int | None
    environment: str
    state: str
    last_error: str | None
    who: str
    created_at: datetime
    updated_at: datetime
    joined_at: datetime | None


@dataclass(frozen=True)
class NewRemoteWorker:
    """What is stored of a worker being added (the rest is set by the store)."""

    name: str
    host: str
    port: int
    ssh_user: str
    gpu: int | None
    environment: str


def _record(row: RemoteWorkerRow) -> RemoteWorkerRecord:
    return RemoteWorkerRecord(**{f.name: getattr(row, f.name) for f in fields(RemoteWorkerRecord)})


def _check_state(state: str) -> None:
    if state not in REMOTE_WORKER_STATES:
        raise ValueError(
            f"Remote worker 'state' has value {state!r}; expected one of "
            f"{', '.join(REMOTE_WORKER_STATES)}"
        )


class RemoteWorkerStore:
    def __init__(self, engine: Engine) -> None:
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def next_launch(self) -> int:
        """The serial of the next add: one more than any stored."""
        with self._sessions.begin() as session:
            return int(session.scalar(select(func.max(RemoteWorkerRow.launch))) or 0) + 1

    def add(
        self, launch: int, workers: list[NewRemoteWorker], who: str
    ) -> list[RemoteWorkerRecord]:
        """Stores the workers of one add, ``starting``."""
        now = utcnow()
        rows = [
            RemoteWorkerRow(
                **{f.name: getattr(w, f.name) for f in fields(NewRemoteWorker)},
                launch=launch,
                state="starting",
                who=who,
                created_at=now,
                updated_at=now,
            )
            for w in workers
        ]
        with self._sessions.begin() as session:
            session.add_all(rows)
            session.flush()
            return [_record(row) for row in rows]

    def set_state(
        self, worker_id: int, state: str, error: str | None = None
    ) -> RemoteWorkerRecord | None:
        """Records ``state`` (and ``error`` as the last error when given; ``joined`` also
        sets ``joined_at``). None when the row is gone (retired meanwhile)."""
        _check_state(state)
        with self._sessions.begin() as session:
            row = session.get(RemoteWorkerRow, worker_id)
            if row is None:
                return None
            row.state, row.updated_at = state, utcnow()
            if error is not None:
                row.last_error = error
            if state == "joined":
                row.joined_at = row.updated_at
            return _record(row)

    def remove(self, worker_id: int) -> bool:
        """Deletes the row (a retired worker); False when there was none."""
        with self._sessions.begin() as session:
            done = session.execute(delete(RemoteWorkerRow).where(RemoteWorkerRow.id == worker_id))
            return bool(getattr(done, "rowcount", 0))

    def list(self) -> list[RemoteWorkerRecord]:
        """Every stored worker, oldest first."""
        with self._sessions.begin() as session:
            rows = session.scalars(select(RemoteWorkerRow).order_by(RemoteWorkerRow.id))
            return [_record(row) for row in rows]
