"""The Starlette application: OpenAI API, routing decisions, health, metrics, OpenAPI."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from dynask.control_plane.api.errors import APIError, from_serving
from dynask.control_plane.api.openai_routes import make_openai_routes
from dynask.control_plane.api.openapi_document import openapi_document
from dynask.control_plane.api.routing_routes import make_routing_routes
from dynask.control_plane.serving.errors import ServingError
from dynask.control_plane.serving.service import ServingService

log = logging.getLogger(__name__)

Lifespan = Callable[[Starlette], AbstractAsyncContextManager[None]]


def build_app(
    service: ServingService,
    lifespan: Lifespan | None = None,
    extra_routes: list[BaseRoute] | None = None,
    middleware: Sequence[Middleware] = (),
) -> Starlette:
    """The control plane's HTTP app over ``service``; ``lifespan`` starts the cluster side;
    ``middleware`` wraps every route (the API-key guard is one)."""
    routes: list[BaseRoute] = [
        *make_openai_routes(service),
        *make_routing_routes(service),
        *_operational_routes(service),
        *(extra_routes or []),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan or _no_lifespan,
        middleware=list(middleware),
        exception_handlers={
            APIError: _api_error,
            ServingError: _serving_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
    )


@asynccontextmanager
async def _no_lifespan(_: Starlette) -> AsyncIterator[None]:
    yield


def _operational_routes(service: ServingService) -> list[Route]:
    async def health(_: Request) -> Response:
        actors = [
            {
                "name": a.name,
                "deployment": a.deployment,
                "worker": a.worker,
                "in_flight": a.in_flight,
            }
            for a in service.ready_actors()
        ]
        status = 200 if actors else 503
        return JSONResponse(
            {"status": "ready" if actors else "starting", "engines": actors}, status
        )

    async def live(_: Request) -> Response:
        return JSONResponse({"status": "live"})

    async def metrics(_: Request) -> Response:
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    async def openapi(_: Request) -> Response:
        return JSONResponse(openapi_document())

    return [
        Route("/health", health),
        Route("/live", live),
        Route("/metrics", metrics),
        Route("/openapi.json", openapi),
    ]


async def _api_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _serving_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServingError)
    return await _api_error(request, from_serving(exc))


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = APIError(str(exc.detail), status=exc.status_code, code=f"http_{exc.status_code}")
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error serving %s %s", request.method, request.url.path)
    error = APIError(
        f"internal error: {type(exc).__name__}: {exc}", status=500, code="internal_error"
    )
    return JSONResponse(error.body(), status_code=500)
