"""The engines over HTTP: ``GET /v1/engines`` (the ready engine actors, their placement,
load and latest stats) and ``POST /v1/engines/reset_prefix_cache`` (every engine, or one
model's, empties its prefix cache, so what comes next starts cold).

The reset itself (what the engines and the routers do) is ``routing.cache_reset``'s.
Here: 200 when every engine reset, 409 (``engines_busy``) naming those that could not, so
a script can retry once their requests finish; under ``/v1``, so the API-key guard
covers it; no body (a JSON body is refused by name rather than ignored); ``model``
(query) picks one model, an unknown one is a 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dynask.control_plane.api.errors import APIError, invalid
from dynask.control_plane.api.openapi_document import ApiRoute, Operation
from dynask.control_plane.api.request_fields import Text, served_model, shown
from dynask.control_plane.routing.cache_reset import reset_prefix_caches
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


MODEL = Text("model", "only this model's engines (default: every model's)")
OPERATION = Operation(
    "Empty the engines' prefix caches (each when no request holds its KV blocks)",
    {
        "200": '{"reset": true, "engines": [{"name", "model", "reset", "reason"}]}',
        "409": "some engine could not reset (requests hold blocks, or it has no cache "
        "it can empty): OpenAI's error body plus the same engines list",
    },
    {"400": "a body or a query field other than model", "404": "unknown model"},
    query=(MODEL,),
)


def make_prefix_cache_routes(service: ServingService) -> list[ApiRoute]:
    async def reset(request: Request) -> Response:
        extra = sorted(set(request.query_params) - {MODEL.name})
        if extra:
            raise invalid(extra[0], f"unknown query field {shown(extra[0])}; only 'model'")
        if await request.body():
            raise APIError(
                "this endpoint takes no body; name one model with ?model=", code="unexpected_body"
            )
        names = _models(service, request.query_params.get(MODEL.name))
        engines = await reset_prefix_caches(service.models, names)
        listed = [e.to_dict() for e in engines]
        busy = [e for e in engines if not e.reset]
        if not busy:
            return JSONResponse({"reset": True, "engines": listed})
        error = APIError(
            f"{len(busy)} of {len(engines)} engines did not reset: "
            + "; ".join(f"{e.name}: {e.reason}" for e in busy),
            status=409,
            code="engines_busy",
        )
        return JSONResponse({**error.body(), "reset": False, "engines": listed}, 409)

    return [
        ApiRoute("/v1/engines/reset_prefix_cache", reset, methods=["POST"], operation=OPERATION)
    ]


def _models(service: ServingService, model: str | None) -> list[str]:
    chosen = served_model(model, service.models)
    return sorted(service.models) if chosen is None else [chosen]
