"""The CLI's hook: the admin account on first start, and the routes at /admin."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.routing import Mount

from dynask.control_plane.api.key_guard import ApiKeyGuard
from dynask.control_plane.cluster.cluster_admin import ClusterAdmin
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.cluster.remote_workers import RemoteWorkers
from dynask.control_plane.server import ServerOptions
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.admin_users import AdminUsers
from dynask.control_plane.state.api_keys import ApiKeys
from dynask.control_plane.state.database import make_engine, upgrade
from dynask.control_plane.state.repository import Repository
from dynask.web.mount import admin_extension


def _control_plane(tmp_path: Path) -> SimpleNamespace:
    """What ``admin_extension`` reads of a ``ControlPlane``."""
    engine = make_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    upgrade(engine)
    service = ServingService(ServingMetrics())
    keys = ApiKeys(engine)
    repo, runtime, options = (
        Repository(engine),
        ClusterRuntime(service, []),
        ServerOptions(port=8123),
    )
    cluster_admin = ClusterAdmin(runtime)
    return SimpleNamespace(
        repo=repo,
        service=service,
        runtime=runtime,
        cluster_admin=cluster_admin,
        remote_workers=RemoteWorkers(cluster_admin, repo, options.ssh.settings()),
        options=options,
        api_keys=keys,
        key_guard=ApiKeyGuard(keys),
    )


def test_a_generated_password_is_printed_on_the_first_start_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DYNASK_ADMIN_PASSWORD", raising=False)
    control_plane = _control_plane(tmp_path)
    first, second = io.StringIO(), io.StringIO()
    routes = admin_extension(control_plane, console=first)  # type: ignore[arg-type]
    admin_extension(control_plane, console=second)  # type: ignore[arg-type]
    lines = first.getvalue().splitlines()
    assert lines[0].startswith("dynask: created the admin UI account 'admin' with the password ")
    password = lines[0].rsplit(" ", 1)[1]
    assert AdminUsers(control_plane.repo.engine).authenticate("admin", password) is not None
    assert second.getvalue() == "dynask: admin UI on http://127.0.0.1:8123/admin/\n"
    assert [getattr(r, "path", None) for r in routes] == ["/", "/admin", "/admin"]
    assert isinstance(routes[2], Mount)


def test_the_password_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNASK_ADMIN_PASSWORD", "from-the-environment")
    control_plane = _control_plane(tmp_path)
    console = io.StringIO()
    admin_extension(control_plane, console=console)  # type: ignore[arg-type]
    assert "password" not in console.getvalue()
    users = AdminUsers(control_plane.repo.engine)
    assert users.authenticate("admin", "from-the-environment") is not None
