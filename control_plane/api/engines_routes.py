"""The engines over HTTP: ``GET /v1/engines`` (the ready engine actors, their placement,
load and latest stats) and ``POST /v1/engines/reset_prefix_cache`` (every engine, or one
model's, empties its prefix cache, so what comes next starts cold).

Design decisions of the reset:

- What it is for: a benchmark whose phases share engines (``bench.routing.trace_replay``
  runs each routing mode on the same actors) starts each phase as a fresh engine would,
  and an operator drops what a workload no longer needs. vLLM has the same endpoint
  (``/reset_prefix_cache``) and SGLang a ``/flush_cache``.
- Each engine decides for itself, under its step lock: it resets only when no request
  holds KV blocks (a running request's blocks must keep their identity). The answer names
  every engine with ``reset`` and, when false, its ``reason``: 200 when all reset, 409
  (``engines_busy``) when some could not, so a script can retry once the requests finish.
- The routers follow: an engine with KV events sends ``AllBlocksCleared`` and the exact
  index drops its blocks; the answer waits (briefly) until this control plane has applied
  it, so the next request is routed without them. What the router only assumed (the
  approximate index, the predicted blocks) is dropped here.
- Under ``/v1``, so the API-key guard covers it. No body: a JSON body is refused by name
  rather than ignored; ``model`` (query) picks one model, an unknown one is a 404.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dynask.control_plane.api.errors import APIError, invalid
from dynask.control_plane.api.openapi_document import ApiRoute, Operation
from dynask.control_plane.api.request_fields import Text, shown
from dynask.control_plane.routing.model_routing import ModelRouting
from dynask.control_plane.serving.actor_handle import CALL_TIMEOUT_S, ActorHandle
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


HEAR_WAIT_S = 2.0  # for the routers to apply an engine's AllBlocksCleared
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
        targets = _targets(service, request.query_params.get(MODEL.name))
        results = await asyncio.gather(*(_reset_one(model, actor) for model, actor in targets))
        for (model, actor), result in zip(targets, results, strict=True):
            event_id = result.pop("event_id")
            if result["reset"]:
                routing = service.models[model].routing
                routing.forget_cached(actor.name)
                await _heard(routing, actor.name, event_id)
        engines = [
            {"name": actor.name, "model": model, **result}
            for (model, actor), result in zip(targets, results, strict=True)
        ]
        busy = [e for e in engines if not e["reset"]]
        if not busy:
            return JSONResponse({"reset": True, "engines": engines})
        error = APIError(
            f"{len(busy)} of {len(engines)} engines did not reset: "
            + "; ".join(f"{e['name']}: {e['reason']}" for e in busy),
            status=409,
            code="engines_busy",
        )
        return JSONResponse({**error.body(), "reset": False, "engines": engines}, 409)

    return [
        ApiRoute("/v1/engines/reset_prefix_cache", reset, methods=["POST"], operation=OPERATION)
    ]


def _targets(service: ServingService, model: str | None) -> list[tuple[str, ActorHandle]]:
    if model is not None and model not in service.models:
        available = ", ".join(sorted(service.models)) or "none"
        raise APIError(
            f"the model {shown(model)} is not served; available: {available}",
            status=404,
            param="model",
            code="model_not_found",
        )
    names = [model] if model is not None else sorted(service.models)
    return [(name, a) for name in names for a in service.models[name].actors if not a.broken]


async def _heard(routing: ModelRouting, actor: str, event_id: int | None) -> None:
    """Waits (at most ``HEAR_WAIT_S``) until the actor's KV events up to ``event_id`` (its
    ``AllBlocksCleared``) are in the index: the next request is routed without its old
    blocks. The events come on the actor's stream, the answer on another connection."""
    if event_id is None or routing.sync(actor) is None:
        return
    deadline = time.monotonic() + HEAR_WAIT_S
    while routing.prefix.expected_event_id(actor) <= event_id and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


async def _reset_one(model: str, actor: ActorHandle) -> dict[str, Any]:
    """One actor's answer; an actor that fails to answer is reported, not raised."""
    try:
        answer = await asyncio.wait_for(actor.proxy.reset_prefix_cache(), CALL_TIMEOUT_S)
    except Exception as exc:  # unreachable or old actor: its entry says so
        return {
            "reset": False,
            "reason": f"the engine actor did not answer: {exc!r}",
            "event_id": None,
        }
    return {
        "reset": bool(answer.get("reset")),
        "reason": answer.get("reason"),
        "event_id": answer.get("event_id"),
    }
