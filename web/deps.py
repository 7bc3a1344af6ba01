"""What the admin routes are given: the control plane's public objects and the renderer."""

from __future__ import annotations

from dataclasses import dataclass, field

from dynask.control_plane.api.key_guard import ApiKeyGuard
from dynask.control_plane.cluster.cluster_admin import ClusterAdmin
from dynask.control_plane.cluster.deployment_admin import DeploymentAdmin
from dynask.control_plane.cluster.remote_workers import RemoteWorkers
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.admin_users import AdminUsers
from dynask.control_plane.state.api_keys import ApiKeys
from dynask.control_plane.state.repository import Repository
from dynask.web.login_throttle import LoginThrottle
from dynask.web.templating import Renderer


@dataclass(frozen=True)
class AdminDeps:
    renderer: Renderer
    users: AdminUsers
    repo: Repository
    service: ServingService
    cluster: ClusterAdmin
    deployments: DeploymentAdmin
    api_keys: ApiKeys
    key_guard: ApiKeyGuard  # mints the chat page's short-lived key
    keys_required: bool  # does /v1 need a key (shown on the API keys page)
    login_throttle: LoginThrottle = field(default_factory=LoginThrottle)
    remote_workers: RemoteWorkers | None = None  # None: no "workers on other hosts" page
