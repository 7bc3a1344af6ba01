"""Remote workers outlive a control plane restart: a real ``dynask run`` adds one over a
real ``sshd`` (its SSH settings given as ``--ssh-known-hosts``/``--ssh-key``), stops, and a
second ``dynask run`` on the same database logs in again and the worker rejoins its
scheduler; retiring it then removes it from the database.

A stored worker that cannot be started again (its key is refused now) is shown ``exited``
with the reason: that part runs without a control plane process (``RemoteWorkers``
over a real scheduler), as it needs no worker to start.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from distributed import LocalCluster

from dynask.control_plane.cluster.cluster_admin import ClusterAdmin
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.cluster.remote_workers import RESTART_FAILED, RemoteWorkers
from dynask.control_plane.cluster.ssh_settings import SSHSettings
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.database import make_engine, upgrade
from dynask.control_plane.state.remote_worker_store import (
    NewRemoteWorker,
    RemoteWorkerRecord,
    RemoteWorkerStore,
)
from dynask.control_plane.state.repository import Repository
from tests.control_plane import server_process as sp
from tests.control_plane.cluster.sshd_server import SSHServer, running_sshd
from tests.web.admin_stack import log_in

pytestmark = pytest.mark.slow
PASSWORD = "remote-restart-password"
WORKER = "remote-1-127-0-0-1-cpu"
JOIN_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


def _stored(folder: Path) -> list[RemoteWorkerRecord]:
    engine = make_engine(f"sqlite:///{folder / 'state.db'}")
    try:
        return RemoteWorkerStore(engine).list()
    finally:
        engine.dispose()


def _remote_events(folder: Path) -> list[str]:
    engine = make_engine(f"sqlite:///{folder / 'state.db'}")
    try:
        events = reversed(Repository(engine).recent_events())
        return [e.kind for e in events if e.kind.startswith("worker.remote.")]
    finally:
        engine.dispose()


def _scheduler_workers(client: httpx.Client) -> set[str]:
    snapshot = client.get("/admin/api/snapshot").json()
    return {str(w["name"]) for w in snapshot["cluster"]["workers"]}


def _wait_joined(
    client: httpx.Client, folder: Path, after: datetime | None = None
) -> RemoteWorkerRecord:
    """The stored worker once it has joined (after ``after``) and the scheduler lists it."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while time.monotonic() < deadline:
        [stored] = _stored(folder)
        assert stored.state in ("starting", "joined"), stored.last_error
        joined = stored.joined_at is not None and (after is None or stored.joined_at > after)
        if joined and WORKER in _scheduler_workers(client):
            return stored
        time.sleep(0.5)
    raise TimeoutError(f"{WORKER} did not join within {JOIN_TIMEOUT_S:.0f}s")


def test_a_remote_worker_is_started_again_after_a_restart(sshd: SSHServer, tmp_path: Path) -> None:
    args = ["--out", "echo", "--workers", "1"]
    args += ["--ssh-known-hosts", str(sshd.known_hosts), "--ssh-key", str(sshd.client_key)]
    env = {"DYNASK_ADMIN_PASSWORD": PASSWORD}
    with (
        sp.dynask_run(tmp_path, args, env) as (base, _),
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        csrf = log_in(client, PASSWORD)
        page = client.get("/admin/workers/remote").text
        assert f'<code id="ssh-known-hosts">{sshd.known_hosts}</code>' in page
        assert f'<code id="ssh-key">{sshd.client_key}</code>' in page
        assert page.count("(from --ssh-known-hosts;") == 1 and "(from --ssh-key;" in page
        form = {"csrf_token": csrf, "host": "127.0.0.1", "port": str(sshd.port)}
        form |= {"user": sshd.user, "gpus": "0", "environment": sys.executable}
        assert client.post("/admin/workers/remote", data=form).status_code == 303
        first = _wait_joined(client, tmp_path)
    assert [(w.name, w.state) for w in _stored(tmp_path)] == [(WORKER, "joined")]  # kept

    with (
        sp.dynask_run(tmp_path, args, env) as (base, _),
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        csrf = log_in(client, PASSWORD)
        again = _wait_joined(client, tmp_path, after=first.joined_at)
        assert (again.id, again.name, again.created_at) == (first.id, WORKER, first.created_at)
        assert f'data-remote-worker="{WORKER}"' in client.get("/admin/workers/remote").text
        retired = client.post(f"/admin/workers/remote/{again.id}/retire", data={"csrf_token": csrf})
        assert retired.status_code == 303
        assert _stored(tmp_path) == []
    assert _remote_events(tmp_path) == [
        "worker.remote.starting",
        "worker.remote.joined",
        "worker.remote.restarting",
        "worker.remote.joined",
        "worker.remote.retired",
    ]


def test_a_worker_that_cannot_start_again_is_shown_exited(sshd: SSHServer, tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'state.db'}")
    upgrade(engine)
    repo = Repository(engine)
    store = RemoteWorkerStore(engine)
    where = ("127.0.0.1", sshd.port, sshd.user)
    [kept] = store.add(1, [NewRemoteWorker(WORKER, *where, None, sys.executable)], "ops")
    store.set_state(kept.id, "joined")
    refused = SSHSettings(sshd.known_hosts, sshd.unknown_key)  # the key is not let in now

    async def restart() -> None:
        async with LocalCluster(
            n_workers=0, asynchronous=True, dashboard_address=None, host="127.0.0.1"
        ) as cluster:
            runtime = ClusterRuntime(
                ServingService(ServingMetrics()), [], cluster.scheduler_address
            )
            await runtime.start()
            remote = RemoteWorkers(ClusterAdmin(runtime), repo, refused)
            try:
                await remote.restore()
                [worker] = remote.workers()
                while worker.state == "starting":
                    await asyncio.sleep(0.1)
                assert (worker.id, worker.name, worker.state) == (kept.id, WORKER, "exited")
                assert worker.detail == (
                    f"{RESTART_FAILED}authentication refused for {sshd.user}@127.0.0.1:"
                    f"{sshd.port}: Permission denied for user {sshd.user} on host 127.0.0.1 "
                    f"(client key: {sshd.unknown_key})"
                )
                [stored] = store.list()
                assert (stored.state, stored.last_error) == ("exited", worker.detail)
                await remote.retire(worker.id, "ops")  # an exited worker is only removed
                assert remote.workers() == [] and store.list() == []
            finally:
                await remote.close()
                await runtime.stop()

    asyncio.run(restart())
    kinds = [(e.who, e.kind) for e in reversed(repo.recent_events())]
    assert kinds == [
        ("remote-workers", "worker.remote.restarting"),
        ("remote-workers", "worker.remote.exited"),
        ("ops", "worker.remote.removed"),
    ]
    engine.dispose()
