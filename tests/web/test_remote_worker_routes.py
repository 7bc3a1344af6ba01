"""The remote workers page's routes: login, CSRF, the form's checks (no SSH reached)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from dynask.control_plane.cluster.remote_workers import RemoteWorkers
from dynask.control_plane.cluster.ssh_settings import SSHSettings
from dynask.control_plane.state.remote_worker_store import NewRemoteWorker
from dynask.web.mount import admin_routes
from tests.web.admin_stack import AdminStack, log_in


@pytest.fixture
def client(stack: AdminStack, tmp_path: Path) -> Iterator[TestClient]:
    settings = SSHSettings(tmp_path / "known_hosts", None)
    remote = RemoteWorkers(stack.deps.cluster, stack.deps.repo, settings)
    deps = dataclasses.replace(stack.deps, remote_workers=remote)
    app = Starlette(routes=admin_routes(deps, "test-secret"))
    with TestClient(app, follow_redirects=False) as made:
        yield made


def _form(csrf: str, **values: str) -> dict[str, str]:
    return {
        "csrf_token": csrf,
        "host": "gpu-1",
        "port": "22",
        "user": "ops",
        "gpus": "2",
        "environment": "/opt/venv",
        **values,
    }


def test_the_page_needs_a_login(client: TestClient) -> None:
    response = client.get("/admin/workers/remote", headers={"accept": "text/html"})
    assert response.status_code == 303
    assert response.headers["location"] == "/admin/login?next=/admin/workers/remote"


def test_adding_needs_the_csrf_token(client: TestClient) -> None:
    log_in(client)
    response = client.post("/admin/workers/remote", data=_form("forged"))
    assert response.status_code == 403
    assert response.json()["error"]["message"].startswith("CSRF token invalid")


def test_wrong_fields_come_back_named(client: TestClient) -> None:
    csrf = log_in(client)
    response = client.post("/admin/workers/remote", data=_form(csrf, port="x", gpus="99", user=""))
    assert response.status_code == 400
    assert "&#39;x&#39; is not an integer from 1 to 65535" in response.text
    assert 'id="error-user">required<' in response.text
    assert 'value="gpu-1"' in response.text  # what was typed is kept
    response = client.post("/admin/workers/remote", data=_form(csrf, gpus="99"))
    assert "Remote worker &#39;gpus&#39; has value 99; expected an integer from 0 to 16" in (
        response.text
    )


def test_a_cluster_that_is_not_started_refuses(client: TestClient) -> None:
    csrf = log_in(client)
    response = client.post("/admin/workers/remote", data=_form(csrf))
    assert response.status_code == 400
    assert "the cluster is still starting; try again in a moment" in response.text


def test_retiring_an_unknown_worker_is_a_flash(client: TestClient) -> None:
    csrf = log_in(client)
    response = client.post("/admin/workers/remote/7/retire", data={"csrf_token": csrf})
    assert (response.status_code, response.headers["location"]) == (303, "/admin/workers/remote")
    assert "no remote worker has the id 7" in client.get("/admin/workers/remote").text


def test_a_stored_failed_worker_is_shown_and_can_be_removed(
    stack: AdminStack, tmp_path: Path
) -> None:
    settings = SSHSettings(tmp_path / "known_hosts", None, "--ssh-known-hosts", "default")
    remote = RemoteWorkers(stack.deps.cluster, stack.deps.repo, settings)
    new = NewRemoteWorker("remote-4-gpu-1-gpu0", "gpu-1", 2222, "ops", 0, "/opt/venv")
    [kept] = remote.store.add(4, [new], "ops")
    remote.store.set_state(kept.id, "failed", "host unreachable: ops@gpu-1:2222: refused")
    asyncio.run(remote.restore())  # a failed worker is shown, not started again
    deps = dataclasses.replace(stack.deps, remote_workers=remote)
    with TestClient(
        Starlette(routes=admin_routes(deps, "test-secret")), follow_redirects=False
    ) as client:
        csrf = log_in(client)
        page = client.get("/admin/workers/remote").text
        assert 'data-remote-worker="remote-4-gpu-1-gpu0"' in page
        assert "host unreachable: ops@gpu-1:2222: refused" in page
        assert f'<code id="ssh-known-hosts">{tmp_path / "known_hosts"}</code>' in page
        assert "(from --ssh-known-hosts;" in page
        assert '<code id="ssh-key">~/.ssh/id_* and the SSH agent</code>' in page
        response = client.post(f"/admin/workers/remote/{kept.id}/retire", data={"csrf_token": csrf})
        assert response.status_code == 303
        page = client.get("/admin/workers/remote").text
        assert "Remote worker remote-4-gpu-1-gpu0 removed." in page
        assert "data-remote-worker=" not in page
    assert remote.store.list() == []
    [event] = stack.deps.repo.recent_events(1)
    assert (event.who, event.kind, event.details["state"]) == (
        "admin",
        "worker.remote.removed",
        "failed",
    )
