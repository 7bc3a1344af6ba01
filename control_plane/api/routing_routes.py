"""``GET /v1/routing/decisions``: the router's recent decisions, each with its reasons.

Query parameters: ``limit`` (1 to the log's size, default 100) and ``model`` (default:
every model). The answer is OpenAI's list shape, newest first; each item is a
``RoutingDecision.to_dict()`` with the model's name: every candidate's overlap and load
terms and cost, the winner, the mode and the router's own time.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dynask.control_plane.api.errors import invalid
from dynask.control_plane.api.openapi_document import ApiRoute, Operation
from dynask.control_plane.api.request_fields import Integer, Text, served_model, shown
from dynask.control_plane.serving.service import ServingService

DEFAULT_LIMIT = 100
LIMIT = Integer(
    "limit",
    f"how many decisions, newest first (default {DEFAULT_LIMIT}; at most the log's size)",
    low=1,
)
MODEL = Text("model", "only this model's decisions (default: every model)")
OPERATION = Operation(
    "Recent routing decisions with every candidate's terms",
    {"200": "list, newest first"},
    {"400": "limit outside [1, the decision log's size]", "404": "unknown model"},
    query=(LIMIT, MODEL),
)


def make_routing_routes(service: ServingService) -> list[ApiRoute]:
    async def decisions(request: Request) -> Response:
        limit = _limit(request.query_params.get("limit"), service.routing.log_size)
        model = served_model(request.query_params.get("model"), service.models)
        return JSONResponse({"object": "list", "data": service.decisions(limit, model)})

    return [ApiRoute("/v1/routing/decisions", decisions, methods=["GET"], operation=OPERATION)]


def _limit(value: str | None, most: int) -> int:
    if value is None:
        return min(DEFAULT_LIMIT, most)
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not LIMIT.low <= limit <= most:
        raise invalid(
            "limit",
            f"'limit' has value {shown(value)}; expected an integer in [{LIMIT.low}, {most}]",
        )
    return limit
