"""Plugging the admin UI into a control plane (called by the CLI, the composition root).

``admin_extension`` is a ``http_server.Extension``: given the wired ``ControlPlane`` it
makes sure the ``admin`` account exists (printing a generated password once, on the
first start), and returns the routes that serve the UI at ``/admin``.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from dynask.control_plane.cluster.deployment_admin import DeploymentAdmin
from dynask.control_plane.server import ControlPlane
from dynask.control_plane.state.admin_users import (
    ADMIN_PASSWORD_VARIABLE,
    ADMIN_USERNAME,
    AdminUsers,
)
from dynask.web.app import make_admin_app
from dynask.web.auth import session_secret
from dynask.web.deps import AdminDeps
from dynask.web.templating import BASE, Renderer


def admin_extension(control_plane: ControlPlane, console: TextIO = sys.stderr) -> list[BaseRoute]:
    """The admin UI's routes for ``control_plane``; creates the admin account once."""
    users = AdminUsers(control_plane.repo.engine)
    made = users.ensure_admin(os.environ.get(ADMIN_PASSWORD_VARIABLE))
    if made.generated_password is not None:
        print(
            f"dynask: created the admin UI account '{ADMIN_USERNAME}' with the password "
            f"{made.generated_password}\n"
            f"        (shown once; set {ADMIN_PASSWORD_VARIABLE} before the first start "
            "to choose it)",
            file=console,
        )
    if made.password_changed:
        print(
            f"dynask: the admin UI account '{ADMIN_USERNAME}' now has the password in "
            f"{ADMIN_PASSWORD_VARIABLE} (it differed from the stored one)",
            file=console,
        )
    deps = AdminDeps(
        renderer=Renderer(),
        users=users,
        repo=control_plane.repo,
        service=control_plane.service,
        cluster=control_plane.cluster_admin,
        deployments=DeploymentAdmin(control_plane.repo, control_plane.runtime),
        api_keys=control_plane.api_keys,
        key_guard=control_plane.key_guard,
        keys_required=control_plane.options.require_api_key,
        remote_workers=control_plane.remote_workers,
    )
    options = control_plane.options
    print(f"dynask: admin UI on http://{options.host}:{options.port}{BASE}/", file=console)
    return admin_routes(deps, session_secret())


def admin_routes(deps: AdminDeps, secret: str) -> list[BaseRoute]:
    """``/admin`` (the app) and ``/`` (a redirect to it)."""

    async def to_admin(_: Request) -> Response:
        return RedirectResponse(f"{BASE}/", status_code=307)

    return [
        Route("/", to_admin, methods=["GET"], include_in_schema=False),  # not the API
        Route(BASE, to_admin, methods=["GET"], include_in_schema=False),
        Mount(BASE, app=make_admin_app(deps, secret)),
    ]
