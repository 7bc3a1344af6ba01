"""What the admin routes are given: the control plane's public objects and the renderer."""

from __future__ import annotations

from dataclasses import dataclass

from dynask.control_plane.admin_users import AdminUsers
from dynask.control_plane.cluster_admin import ClusterAdmin
from dynask.control_plane.deployment_admin import DeploymentAdmin
from dynask.control_plane.repository import Repository
from dynask.control_plane.service import ServingService
from dynask.web.templating import Renderer


@dataclass(frozen=True)
class AdminDeps:
    renderer: Renderer
    users: AdminUsers
    repo: Repository
    service: ServingService
    cluster: ClusterAdmin
    deployments: DeploymentAdmin
