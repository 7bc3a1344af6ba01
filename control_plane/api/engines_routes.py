"""``GET /v1/engines``: the ready engine actors, their placement, load and latest stats."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dynask.control_plane.api.openapi_document import ApiRoute, Operation
from dynask.control_plane.serving.service import ServingService


def make_engines_routes(
    service: ServingService, refresh_stats: Callable[[], Awaitable[None]]
) -> list[ApiRoute]:
    """``refresh_stats`` asks every actor for fresh stats before the answer is built."""

    async def engines(_: Request) -> Response:
        await refresh_stats()
        return JSONResponse(
            [
                {
                    "name": a.name,
                    "deployment": a.deployment,
                    "worker": a.worker,
                    "in_flight": a.in_flight,
                    "stats": a.stats.to_dict() if a.stats is not None else {},
                }
                for a in service.ready_actors()
            ]
        )

    operation = Operation(
        "The ready engine actors: placement, requests in flight, latest stats",
        {"200": "an array of engines"},
    )
    return [ApiRoute("/v1/engines", engines, methods=["GET"], operation=operation)]
