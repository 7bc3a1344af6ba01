"""Remote workers as stored (``remote_workers``, migration 0010), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from dynask.control_plane.state.database import upgrade
from dynask.control_plane.state.remote_worker_store import NewRemoteWorker, RemoteWorkerStore


def _new(name: str, gpu: int | None) -> NewRemoteWorker:
    return NewRemoteWorker(name, "gpu-1", 2222, "ops", gpu, "/opt/venv")


def test_add_change_and_remove(db_engine: Engine) -> None:
    upgrade(db_engine)
    store = RemoteWorkerStore(db_engine)
    assert store.next_launch() == 1
    gpu0, gpu1 = store.add(
        1, [_new("remote-1-gpu-1-gpu0", 0), _new("remote-1-gpu-1-gpu1", 1)], "ops"
    )
    assert (gpu0.launch, gpu0.state, gpu0.who, gpu0.gpu, gpu1.gpu) == (1, "starting", "ops", 0, 1)
    assert (gpu0.ssh_user, gpu0.port, gpu0.environment) == ("ops", 2222, "/opt/venv")
    assert gpu0.joined_at is None and gpu0.last_error is None
    assert store.next_launch() == 2
    joined = store.set_state(gpu0.id, "joined")
    assert joined is not None and joined.joined_at == joined.updated_at
    failed = store.set_state(gpu1.id, "failed", "host unreachable")
    assert failed is not None and (failed.state, failed.last_error) == (
        "failed",
        "host unreachable",
    )
    assert [(w.name, w.state) for w in store.list()] == [
        ("remote-1-gpu-1-gpu0", "joined"),
        ("remote-1-gpu-1-gpu1", "failed"),
    ]
    assert store.remove(gpu1.id) is True
    assert store.remove(gpu1.id) is False
    assert store.set_state(gpu1.id, "joined") is None  # retired meanwhile
    assert [w.name for w in store.list()] == ["remote-1-gpu-1-gpu0"]


def test_states_and_names_are_checked(db_engine: Engine) -> None:
    upgrade(db_engine)
    store = RemoteWorkerStore(db_engine)
    [worker] = store.add(1, [_new("remote-1-gpu-1-cpu", None)], "ops")
    with pytest.raises(ValueError, match="Remote worker 'state' has value 'retired'; expected one"):
        store.set_state(worker.id, "retired")  # retiring removes the row instead
    with pytest.raises(IntegrityError):
        store.add(2, [_new("remote-1-gpu-1-cpu", None)], "ops")  # a name is never given twice
