"""The admin forms' POST handlers: deployments (create, scale, delete), workers, and
emptying the engines' prefix caches (the routing page).

Each handler reads its form through ``checked_form`` (CSRF), acts as the logged-in user
(the event log's "who"), and answers with a redirect and a flash message (post/redirect/
get), or, when the form is wrong, with the page again: the values kept, the messages
next to their fields, status 400.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from dynask.control_plane.cluster.cluster_admin import ClusterActionError
from dynask.control_plane.cluster.deployment_admin import DeploymentInvalidError
from dynask.control_plane.routing.cache_reset import reset_prefix_caches
from dynask.control_plane.state.repository import (
    DeploymentExistsError,
    DeploymentRejectedError,
    NotFoundError,
)
from dynask.web.auth import checked_form, current_user, flash
from dynask.web.deps import AdminDeps
from dynask.web.forms import DeploymentForm, FormErrors, parse_replicas
from dynask.web.templating import BASE
from dynask.web.views_pages import deployments_context


def make_action_routes(deps: AdminDeps) -> list[Route]:
    async def create_deployment(request: Request) -> Response:
        form = DeploymentForm.from_form(await checked_form(request))
        try:
            spec = form.spec()
            await deps.deployments.create(spec, current_user(request))
        except FormErrors as exc:
            return await _form_again(request, DeploymentForm(form.values, exc.errors))
        except (DeploymentInvalidError, DeploymentExistsError, DeploymentRejectedError) as exc:
            return await _form_again(request, form.with_error(exc))
        flash(request, "ok", f"Deployment '{spec.name}' created; its actors are starting.")
        return _back("deployments")

    async def _form_again(request: Request, form: DeploymentForm) -> Response:
        context = await deployments_context(deps, form)
        return deps.renderer.page(request, "deployments.html", context, status_code=400)

    async def scale_deployment(request: Request) -> Response:
        name = request.path_params["name"]
        form = await checked_form(request)
        errors: dict[str, str] = {}
        replicas = parse_replicas(str(form.get("replicas") or ""), errors)
        if errors:
            flash(request, "error", f"Cannot scale '{name}': {errors['replicas']}.")
            return _back("deployments")
        try:
            scaled = await deps.deployments.scale(name, replicas, current_user(request))
        except NotFoundError as exc:
            flash(request, "error", str(exc))
            return _back("deployments")
        flash(request, "ok", f"Deployment '{name}' scaled to {scaled.replicas} replicas.")
        return _back("deployments")

    async def delete_deployment(request: Request) -> Response:
        name = request.path_params["name"]
        await checked_form(request)
        try:
            await deps.deployments.delete(name, current_user(request))
        except NotFoundError as exc:
            flash(request, "error", str(exc))
            return _back("deployments")
        flash(request, "ok", f"Deployment '{name}' deleted; its actors are stopping.")
        return _back("deployments")

    async def add_worker(request: Request) -> Response:
        await checked_form(request)
        try:
            count = await deps.cluster.add_local_worker()
        except ClusterActionError as exc:
            flash(request, "error", str(exc))
            return _back("workers")
        await _log(deps, request, "worker.added", "local", {"workers": count})
        flash(request, "ok", f"Starting a local worker ({count} in all); it joins in seconds.")
        return _back("workers")

    async def retire_worker(request: Request) -> Response:
        address = str((await checked_form(request)).get("address") or "")
        try:
            await deps.cluster.retire_worker(address)
        except ClusterActionError as exc:
            flash(request, "error", str(exc))
            return _back("workers")
        await _log(deps, request, "worker.retired", address, {})
        flash(request, "ok", f"Worker {address} retired; its actors move to other workers.")
        return _back("workers")

    async def empty_prefix_caches(request: Request) -> Response:
        await checked_form(request)
        engines = await reset_prefix_caches(deps.service.models, sorted(deps.service.models))
        emptied = [e.name for e in engines if e.reset]
        kept = [f"{e.name}: {e.reason}" for e in engines if not e.reset]
        await _log(deps, request, "prefix_cache.reset", "engines", {"emptied": emptied})
        if kept:
            flash(request, "error", f"Emptied {len(emptied)} of {len(engines)}; " + "; ".join(kept))
        else:
            flash(request, "ok", f"Emptied the prefix caches of {len(engines)} engines.")
        return _back("routing")

    return [
        Route("/routing/reset_prefix_cache", empty_prefix_caches, methods=["POST"]),
        Route("/deployments", create_deployment, methods=["POST"], name="create_deployment"),
        Route("/deployments/{name}/scale", scale_deployment, methods=["POST"]),
        Route("/deployments/{name}/delete", delete_deployment, methods=["POST"]),
        Route("/workers/add", add_worker, methods=["POST"], name="add_worker"),
        Route("/workers/retire", retire_worker, methods=["POST"], name="retire_worker"),
    ]


def _back(page: str) -> Response:
    return RedirectResponse(f"{BASE}/{page}", status_code=303)


async def _log(
    deps: AdminDeps, request: Request, kind: str, subject: str, details: dict[str, object]
) -> None:
    await asyncio.to_thread(deps.repo.log_event, current_user(request), kind, subject, details)
