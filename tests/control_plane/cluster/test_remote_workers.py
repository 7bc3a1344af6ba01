"""Remote workers over a real ``sshd``: one joins a real scheduler and gets an engine
actor; the failures (unknown host key, wrong key, unreachable, no environment) say so."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from distributed import LocalCluster

from dynask.control_plane.cluster.cluster_admin import ClusterActionError, ClusterAdmin
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.cluster.remote_commands import RemoteWorkerRequest
from dynask.control_plane.cluster.remote_workers import RemoteWorker, RemoteWorkers
from dynask.control_plane.cluster.ssh_settings import SSHSettings
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.database import make_engine, upgrade
from dynask.control_plane.state.deployment import DeploymentSpec
from dynask.control_plane.state.repository import Repository
from tests.control_plane import server_process as sp
from tests.control_plane.cluster.sshd_server import SSHServer, running_sshd

pytestmark = pytest.mark.slow
PYTHON = sys.executable  # the test's own environment has distributed and dynask


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[Repository]:
    engine = make_engine(f"sqlite:///{tmp_path / 'state.db'}")
    upgrade(engine)
    yield Repository(engine)
    engine.dispose()


Scenario = Callable[[ClusterRuntime, RemoteWorkers], Awaitable[None]]


def _with_cluster(repo: Repository, settings: SSHSettings, scenario: Scenario) -> None:
    """An embedded scheduler with no local worker, and remote workers over SSH."""

    async def run() -> None:
        async with LocalCluster(
            n_workers=0, asynchronous=True, dashboard_address=None, host="127.0.0.1"
        ) as cluster:
            address = cluster.scheduler_address
            runtime = ClusterRuntime(ServingService(ServingMetrics()), [], address)
            await runtime.start()
            remote = RemoteWorkers(ClusterAdmin(runtime), repo, settings)
            try:
                await scenario(runtime, remote)
            finally:
                await remote.close()
                await runtime.stop()

    asyncio.run(run())


def _request(sshd: SSHServer, **changes: object) -> RemoteWorkerRequest:
    fields: dict[str, object] = {
        "host": sshd.host,
        "port": sshd.port,
        "user": sshd.user,
        "environment": PYTHON,
    }
    return RemoteWorkerRequest(**{**fields, **changes})  # type: ignore[arg-type]


async def _settled(worker: RemoteWorker, timeout: float = 90) -> str:
    deadline = asyncio.get_running_loop().time() + timeout
    while worker.state == "starting":
        assert asyncio.get_running_loop().time() < deadline, worker.detail
        await asyncio.sleep(0.2)
    return worker.state


def test_a_remote_worker_joins_gets_an_actor_and_retires(sshd: SSHServer, repo: Repository) -> None:
    settings = SSHSettings(sshd.known_hosts, sshd.client_key)

    async def scenario(runtime: ClusterRuntime, remote: RemoteWorkers) -> None:
        [worker] = await remote.add(_request(sshd), "ops")
        assert worker.name == "remote-1-127-0-0-1-cpu"
        assert await _settled(worker) == "joined", worker.detail
        runtime.set_deployments([DeploymentSpec("echo", engine="echo", replicas=1)])
        await runtime.reconcile()
        [actor] = runtime.service.actors()
        assert (actor.name, actor.worker) == ("echo-0", worker.address)
        await remote.retire(worker.id, "ops")
        assert (worker.state, worker.detail) == ("retired", "retired by ops")
        await worker.process.wait_closed()
        assert worker.process.is_closing()
        client = runtime.client
        assert client is not None
        for _ in range(100):  # the scheduler drops it once its process has gone
            if not (await client.scheduler.identity(n_workers=-1))["workers"]:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.1)
        assert (await client.scheduler.identity(n_workers=-1))["workers"] == {}  # type: ignore[union-attr]

    _with_cluster(repo, settings, scenario)
    kinds = [(e.who, e.kind, e.subject) for e in reversed(repo.recent_events())]
    name = "remote-1-127-0-0-1-cpu"
    assert kinds == [
        ("ops", "worker.remote.starting", name),
        ("remote-workers", "worker.remote.joined", name),
        ("ops", "worker.remote.retired", name),
    ]


def _failure(repo: Repository, settings: SSHSettings, request: RemoteWorkerRequest) -> str:
    details: list[str] = []

    async def scenario(_: ClusterRuntime, remote: RemoteWorkers) -> None:
        workers = await remote.add(request, "ops")
        for worker in workers:
            assert await _settled(worker) == "failed"
            details.append(worker.detail)

    _with_cluster(repo, settings, scenario)
    assert len(set(details)) == 1, details
    assert repo.recent_events()[0].kind == "worker.remote.failed"
    return details[0]


def test_an_unknown_host_key_is_refused(sshd: SSHServer, repo: Repository) -> None:
    settings = SSHSettings(sshd.empty_known_hosts, sshd.client_key)
    detail = _failure(repo, settings, _request(sshd, gpus=2))
    assert detail == (
        "host key refused: Host key is not trusted for host 127.0.0.1 (checked against "
        f"{sshd.empty_known_hosts}); if the host is the one you mean, add its key: "
        f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {sshd.empty_known_hosts}"
    )


def test_a_key_the_server_does_not_know_is_refused(sshd: SSHServer, repo: Repository) -> None:
    settings = SSHSettings(sshd.known_hosts, sshd.unknown_key)
    detail = _failure(repo, settings, _request(sshd))
    assert detail == (
        f"authentication refused for {sshd.user}@127.0.0.1:{sshd.port}: Permission denied "
        f"for user {sshd.user} on host 127.0.0.1 (client key: {sshd.unknown_key})"
    )


def test_an_unreachable_host_is_reported(sshd: SSHServer, repo: Repository) -> None:
    settings = SSHSettings(sshd.known_hosts, sshd.client_key)
    port = sp.free_port()  # nothing listens there
    detail = _failure(repo, settings, _request(sshd, port=port))
    assert detail.startswith(f"host unreachable: {sshd.user}@127.0.0.1:{port}: ")
    assert "Connect call failed" in detail or "refused" in detail


def test_a_missing_environment_is_reported(
    sshd: SSHServer, repo: Repository, tmp_path: Path
) -> None:
    settings = SSHSettings(sshd.known_hosts, sshd.client_key)
    missing = tmp_path / "no-venv"
    detail = _failure(repo, settings, _request(sshd, environment=str(missing)))
    assert detail == f"no such environment on 127.0.0.1: {missing} is not an executable python"


def test_an_environment_without_dask_is_reported(
    sshd: SSHServer, repo: Repository, tmp_path: Path
) -> None:
    settings = SSHSettings(sshd.known_hosts, sshd.client_key)
    bare = "/usr/bin/python3"  # Debian's python, without distributed
    detail = _failure(repo, settings, _request(sshd, environment=bare))
    assert detail.startswith(f"the environment {bare} cannot run a dynask worker: ")
    assert detail.endswith("ModuleNotFoundError: No module named 'distributed'")


def test_a_missing_known_hosts_file_refuses_at_once(
    sshd: SSHServer, repo: Repository, tmp_path: Path
) -> None:
    absent = tmp_path / "known_hosts"
    settings = SSHSettings(absent, sshd.client_key)

    async def scenario(_: ClusterRuntime, remote: RemoteWorkers) -> None:
        with pytest.raises(ClusterActionError, match="which does not exist; trust the host"):
            await remote.add(_request(sshd), "ops")
        assert remote.workers() == []

    _with_cluster(repo, settings, scenario)


def test_a_loopback_scheduler_refuses_another_host(sshd: SSHServer, repo: Repository) -> None:
    settings = SSHSettings(sshd.known_hosts, sshd.client_key)

    async def scenario(_: ClusterRuntime, remote: RemoteWorkers) -> None:
        with pytest.raises(ClusterActionError, match="which gpu-node-7 cannot reach"):
            await remote.add(_request(sshd, host="gpu-node-7"), "ops")

    _with_cluster(repo, settings, scenario)
