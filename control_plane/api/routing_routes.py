"""``GET /v1/routing/decisions``: the router's recent decisions, each with its reasons.

Query parameters: ``limit`` (1 to the log's size, default 100) and ``model`` (default:
every model). The answer is OpenAI's list shape, newest first; each item is a
``RoutingDecision.to_dict()`` with the model's name: every candidate's overlap and load
terms and cost, the winner, the mode and the router's own time.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dynask.control_plane.api.errors import APIError, invalid
from dynask.control_plane.serving.service import ServingService

DEFAULT_LIMIT = 100


def make_routing_routes(service: ServingService) -> list[Route]:
    async def decisions(request: Request) -> Response:
        limit = _limit(request.query_params.get("limit"), service.routing.log_size)
        model = request.query_params.get("model")
        if model is not None and model not in service.models:
            available = ", ".join(sorted(service.models)) or "none"
            raise APIError(
                f"the model '{model}' is not served; available: {available}",
                status=404,
                param="model",
                code="model_not_found",
            )
        return JSONResponse({"object": "list", "data": service.decisions(limit, model)})

    return [Route("/v1/routing/decisions", decisions, methods=["GET"])]


def _limit(value: str | None, most: int) -> int:
    if value is None:
        return min(DEFAULT_LIMIT, most)
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise invalid("limit", f"'limit' has value {value!r}; expected an integer in [1, {most}]")
    return limit
