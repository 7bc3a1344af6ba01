"""The Starlette application: OpenAI API, routing decisions, health, metrics, OpenAPI."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from dynask.control_plane.api.anthropic.routes import make_anthropic_routes
from dynask.control_plane.api.chat_output import ChatOptions
from dynask.control_plane.api.engines_routes import make_prefix_cache_routes
from dynask.control_plane.api.errors import APIError, from_serving
from dynask.control_plane.api.internal_errors import CatchInternalErrors
from dynask.control_plane.api.openai_routes import make_openai_routes
from dynask.control_plane.api.openapi_document import ApiRoute, Operation, openapi_document
from dynask.control_plane.api.request_fields import Choice
from dynask.control_plane.api.responses.routes import make_responses_routes
from dynask.control_plane.api.routing_routes import make_routing_routes
from dynask.control_plane.serving.errors import ServingError
from dynask.control_plane.serving.readiness import DeploymentReadiness, all_ready
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.response_store import ResponseStore

Lifespan = Callable[[Starlette], AbstractAsyncContextManager[None]]
Readiness = Callable[[], list[DeploymentReadiness]]
Leadership = Callable[[], dict[str, str | None]]
READY = Choice(
    "ready",
    "'all': ready only when every replica of every deployment is (as /ready); "
    "left out: when any engine is",
    choices=("all",),
)


def build_app(
    service: ServingService,
    lifespan: Lifespan | None = None,
    extra_routes: list[BaseRoute] | None = None,
    middleware: Sequence[Middleware] = (),
    api_key_required: bool = False,
    response_store: ResponseStore | None = None,
    chat_options: ChatOptions | None = None,
    cors_allow_origins: Sequence[str] = (),
    readiness: Readiness = list,
    leadership: Leadership = dict,
) -> Starlette:
    """The control plane's HTTP app over ``service``; ``lifespan`` starts the cluster side;
    ``middleware`` wraps every route (the API-key guard is one); ``api_key_required`` is
    what ``/openapi.json`` says of the bearer scheme on ``/v1``; ``cors_allow_origins``
    (none: CORS off) are the browser origins that may call the API; ``response_store``
    keeps the Responses API's stored responses (None: ``store`` is ignored);
    ``chat_options``: the tool-call and reasoning parsers; ``readiness`` says how many
    replicas each deployment wants and has (``/ready``); ``leadership`` this control
    plane's id, role (leader or follower) and the leader's id (``/health``).

    Outermost first: CORS (a preflight is answered before any key check, and every answer,
    a 500 too, carries its headers), then ``CatchInternalErrors``, then ``middleware``."""
    routes: list[BaseRoute] = [
        *make_openai_routes(service, chat_options),
        *make_responses_routes(service, response_store, chat_options),
        *make_anthropic_routes(service, chat_options),
        *make_routing_routes(service),
        *make_prefix_cache_routes(service),
        *_operational_routes(service, api_key_required, readiness, leadership),
        *(extra_routes or []),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan or _no_lifespan,
        middleware=[*_cors(cors_allow_origins), Middleware(CatchInternalErrors), *middleware],
        exception_handlers={
            APIError: _api_error,
            ServingError: _serving_error,
            HTTPException: _http_error,
        },
    )


def _cors(origins: Sequence[str]) -> list[Middleware]:
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=list(origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],  # OpenAI's SDKs send many (x-stainless-*): mirror them
            max_age=600,
        )
    ]


@asynccontextmanager
async def _no_lifespan(_: Starlette) -> AsyncIterator[None]:
    yield


def _operational_routes(
    service: ServingService, api_key_required: bool, readiness: Readiness, leadership: Leadership
) -> list[ApiRoute]:
    async def health(request: Request) -> Response:
        wait_for = request.query_params.get("ready")
        if wait_for == "all":
            return await ready(request)
        if wait_for is not None:
            raise APIError(
                f"'ready' has value {wait_for!r}; expected 'all' (every replica of every "
                "deployment ready) or no value (any engine ready)",
                status=400,
                param="ready",
                code="invalid_value",
            )
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
        body = {"status": "ready" if actors else "starting", "engines": actors}
        return JSONResponse({**body, "control_plane": leadership()}, status)

    async def ready(_: Request) -> Response:
        deployments = readiness()
        up = all_ready(deployments)
        return JSONResponse(
            {
                "status": "ready" if up else "starting",
                "deployments": [d.to_dict() for d in deployments],
            },
            200 if up else 503,
        )

    async def live(_: Request) -> Response:
        return JSONResponse({"status": "live"})

    async def metrics(_: Request) -> Response:
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document(request.app.routes, api_key_required))

    get = ["GET"]
    return [
        ApiRoute(
            "/health",
            health,
            methods=get,
            operation=Operation(
                "Readiness: any engine ready (``?ready=all``: as ``/ready``)",
                {"200": "ready", "503": '{"status": "starting"}: no engine ready yet'},
                {"400": "'ready' other than 'all'"},
                query=(READY,),
            ),
        ),
        ApiRoute(
            "/ready",
            ready,
            methods=get,
            operation=Operation(
                "Readiness by deployment: every replica of every deployment ready",
                {
                    "200": "every deployment has all its replicas",
                    "503": '{"status": "starting", "deployments": [{"name", "replicas", "ready"}]}',
                },
            ),
        ),
        ApiRoute("/live", live, methods=get, operation=Operation("Liveness", {"200": "live"})),
        ApiRoute(
            "/metrics",
            metrics,
            methods=get,
            operation=Operation("Prometheus metrics", {"200": "text"}),
        ),
        ApiRoute(
            "/openapi.json",
            openapi,
            methods=get,
            operation=Operation("This document", {"200": "OpenAPI 3.1"}),
        ),
    ]


async def _api_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _serving_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServingError)
    return await _api_error(request, from_serving(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = str(exc.detail)
    path = request.url.path
    if exc.status_code == 404 and (path.startswith("/v1/") or path == "/v1"):
        message = f"{request.method} {path} is not an endpoint of this server; it serves " + (
            ", ".join(_api_endpoints(request))
        )
    error = APIError(message, status=exc.status_code, code=f"http_{exc.status_code}")
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


def _api_endpoints(request: Request) -> list[str]:
    """``METHOD /v1/...`` of every API route of the app."""
    endpoints: dict[str, None] = {}
    for route in request.app.routes:
        if isinstance(route, Route) and route.path.startswith("/v1/"):
            for method in sorted((route.methods or set()) - {"HEAD"}):
                endpoints[f"{method} {route.path}"] = None
    return list(endpoints)
