"""An admin app over a real database and an idle runtime (no Dask cluster started)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx
from starlette.applications import Starlette
from starlette.testclient import TestClient

from dynask.control_plane.api.key_guard import ApiKeyGuard
from dynask.control_plane.cluster.cluster_admin import ClusterAdmin
from dynask.control_plane.cluster.deployment_admin import DeploymentAdmin
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.admin_users import AdminUsers
from dynask.control_plane.state.api_keys import ApiKeys
from dynask.control_plane.state.repository import Repository
from dynask.web.deps import AdminDeps
from dynask.web.mount import admin_routes
from dynask.web.templating import Renderer

PASSWORD = "correct horse battery"
CSRF_INPUT = re.compile(r'name="csrf_token" value="([^"]+)"')


@dataclass
class AdminStack:
    deps: AdminDeps
    runtime: ClusterRuntime
    client: TestClient


def make_stack(repo: Repository) -> AdminStack:
    service = ServingService(ServingMetrics())
    runtime = ClusterRuntime(service, [], scheduler_address=None, n_workers=0)
    users = AdminUsers(repo.engine)
    users.ensure_admin(PASSWORD)
    deps = AdminDeps(
        renderer=Renderer(),
        users=users,
        repo=repo,
        service=service,
        cluster=ClusterAdmin(runtime),
        deployments=DeploymentAdmin(repo, runtime),
        api_keys=(keys := ApiKeys(repo.engine)),
        key_guard=ApiKeyGuard(keys),
        keys_required=True,
    )
    app = Starlette(routes=admin_routes(deps, "test-secret"))
    return AdminStack(deps, runtime, TestClient(app, follow_redirects=False))


def csrf_of(html: str) -> str:
    match = CSRF_INPUT.search(html)
    assert match is not None, "the page has no CSRF field"
    return match.group(1)


def log_in(client: httpx.Client, password: str = PASSWORD) -> str:
    """Logs ``admin`` in; returns the session's CSRF token."""
    token = csrf_of(client.get("/admin/login").text)
    response = client.post(
        "/admin/login",
        data={"username": "admin", "password": password, "csrf_token": token},
    )
    assert response.status_code == 303, response.text
    return csrf_of(client.get("/admin/deployments").text)
