"""The admin pages (GET), the partials their tables refresh from, and the JSON snapshot."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dynask.control_plane.cluster.deployment_admin import DEPLOYABLE_ENGINES
from dynask.control_plane.graphs.store import stored_graphs
from dynask.control_plane.state.deployment import ROLES
from dynask.web.deps import AdminDeps
from dynask.web.forms import MAX_REPLICAS, DeploymentForm
from dynask.web.snapshot import take_snapshot

ROUTING_LOG_LIMIT = 50
EVENTS_LIMIT = 100


def make_page_routes(deps: AdminDeps) -> list[Route]:
    render = deps.renderer

    async def overview(request: Request) -> Response:
        snapshot = await take_snapshot(deps.cluster, deps.service, deps.repo)
        return render.page(request, "overview.html", {"page": "overview", **snapshot.context()})

    async def workers(request: Request) -> Response:
        snapshot = await take_snapshot(deps.cluster, deps.service, deps.repo)
        context = {
            "page": "workers",
            "commands": deps.cluster.worker_commands(),
            **snapshot.context(),
        }
        return render.page(request, "workers.html", context)

    async def deployments(request: Request) -> Response:
        context = await deployments_context(deps, DeploymentForm.empty())
        return render.page(request, "deployments.html", context)

    async def deployments_table(request: Request) -> Response:
        context = {"statuses": await deps.deployments.statuses()}
        return render.block_response(request, "deployments.html", "deployments_table", context)

    async def metrics(request: Request) -> Response:
        return render.page(request, "metrics.html", {"page": "metrics"})

    async def chat(request: Request) -> Response:
        models = sorted(name for name, m in deps.service.models.items() if m.actors)
        # /v1 may need a key: the page's script sends a short-lived one (api_key_guard).
        context = {"page": "chat", "models": models, "api_key": deps.key_guard.mint_session_key()}
        return render.page(request, "chat.html", context)

    async def routing(request: Request) -> Response:
        return render.page(request, "routing.html", {"page": "routing", **routing_context(deps)})

    async def routing_table(request: Request) -> Response:
        return render.block_response(request, "routing.html", "decisions", routing_context(deps))

    async def events(request: Request) -> Response:
        context = {"page": "events", "events": await recent_events(deps)}
        return render.page(request, "events.html", context)

    async def events_table(request: Request) -> Response:
        context = {"events": await recent_events(deps)}
        return render.block_response(request, "events.html", "events_table", context)

    async def snapshot_json(_: Request) -> Response:
        snapshot = await take_snapshot(deps.cluster, deps.service, deps.repo)
        statuses = await deps.deployments.statuses()
        return JSONResponse(
            {
                **dataclasses.asdict(snapshot),
                "deployments": [
                    {"name": s.deployment.name, "state": s.state, "detail": s.detail}
                    for s in statuses
                ],
            }
        )

    return [
        Route("/", overview, methods=["GET"], name="overview"),
        Route("/workers", workers, methods=["GET"], name="workers"),
        Route("/deployments", deployments, methods=["GET"], name="deployments"),
        Route("/deployments/table", deployments_table, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"], name="metrics"),
        Route("/chat", chat, methods=["GET"], name="chat"),
        Route("/routing", routing, methods=["GET"], name="routing"),
        Route("/routing/table", routing_table, methods=["GET"]),
        Route("/events", events, methods=["GET"], name="events"),
        Route("/events/table", events_table, methods=["GET"]),
        Route("/api/snapshot", snapshot_json, methods=["GET"]),
    ]


async def deployments_context(deps: AdminDeps, form: DeploymentForm) -> dict[str, Any]:
    return {
        "page": "deployments",
        "statuses": await deps.deployments.statuses(),
        "form": form,
        "engines": DEPLOYABLE_ENGINES,
        "roles": ROLES,
        "max_replicas": MAX_REPLICAS,
        "graphs": await asyncio.to_thread(stored_graphs, deps.repo.engine),
    }


def routing_context(deps: AdminDeps) -> dict[str, Any]:
    decisions = deps.service.decisions(ROUTING_LOG_LIMIT)
    return {"decisions": decisions, "routing": deps.service.routing}


async def recent_events(deps: AdminDeps) -> list[Any]:
    return await asyncio.to_thread(deps.repo.recent_events, EVENTS_LIMIT)
