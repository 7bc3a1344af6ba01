"""Running the control plane over HTTP: the app, its cluster runtime, and uvicorn.

The server accepts connections at once (``/health`` answers 503 while engines load);
the cluster and the engine actors start in the background. If they fail to start (a bad
model path, say), the error is printed and the server exits with status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from dynask.control_plane.api.app import build_app
from dynask.control_plane.api.chat_output import ChatOptions
from dynask.control_plane.api.engines_routes import make_engines_routes
from dynask.control_plane.api.key_guard import ApiKeyGuard, RequireApiKey
from dynask.control_plane.cluster.cluster_admin import ClusterAdmin
from dynask.control_plane.cluster.gpu_placement import WorkerPlacement
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.cluster.remote_workers import RemoteWorkers
from dynask.control_plane.cluster.ssh_settings import SSHOptions
from dynask.control_plane.cluster.state_sync import (
    ActorRecorder,
    store_deployments,
    stored_deployments,
)
from dynask.control_plane.disagg.orchestrator import DisaggOptions
from dynask.control_plane.flags import flag, origins
from dynask.control_plane.observability.http_tracing import TraceRequests
from dynask.control_plane.observability.tracing import Tracing, TracingOptions
from dynask.control_plane.planner.decision import PlannerConfig
from dynask.control_plane.planner.loop import PlannerLoop
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.gc_policy import settle_heap
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.readiness import all_ready, summary
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.api_keys import ApiKeys, TenantLimits
from dynask.control_plane.state.database import default_database_url, make_engine, upgrade
from dynask.control_plane.state.deployment import DeploymentSpec
from dynask.control_plane.state.repository import Repository
from dynask.control_plane.state.response_store import ResponseStore

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 1.0
ALL_READY_POLL_S = 0.5
STALE_ACTOR_REASON = (
    "left starting/ready by an earlier leader (killed, or gone after handing over); a "
    "running actor is recorded again by the control plane that leads now"
)


@dataclass(frozen=True)
class ServerOptions:
    """How ``run`` and ``serve`` serve; the flagged fields are their common flags."""

    host: str = flag("--host", "127.0.0.1")
    require_api_key: bool = flag(  # /v1 needs ``Authorization: Bearer KEY``
        "--require-api-key",
        False,
        "/v1 needs 'Authorization: Bearer KEY' (see `dynask keys`; default: off)",
        action=argparse.BooleanOptionalAction,
    )
    port: int = flag("--port", 8000, type=int)
    database_url: str | None = flag(  # None: $DYNASK_DATABASE_URL or the SQLite default
        "--database-url", None, "default: $DYNASK_DATABASE_URL or SQLite"
    )
    cors_allow_origins: tuple[str, ...] = flag(
        "--cors-allow-origins",
        (),
        "browser origins allowed to call the API, comma-separated, e.g. "
        "'https://app.example.com,http://localhost:3000' or '*' (default: none, CORS off)",
        type=origins,
    )
    routing: RoutingOptions = field(default_factory=RoutingOptions)
    scheduler_address: str | None = None  # None: an embedded LocalCluster
    n_workers: int = 1
    gpu_placements: tuple[WorkerPlacement, ...] = ()  # embedded workers' GPUs (none: no pin)
    who: str = "cli"  # recorded in the event log
    disagg: DisaggOptions = field(default_factory=DisaggOptions)  # prefill/decode roles
    reliability: ReliabilityOptions = field(default_factory=ReliabilityOptions)
    planner: PlannerConfig | None = None  # None: no autoscaling
    chat: ChatOptions = field(default_factory=ChatOptions)  # tool-call and reasoning parsers
    tenant_defaults: TenantLimits = field(default_factory=TenantLimits)  # keyless tenants
    tracing: TracingOptions = field(default_factory=TracingOptions)  # OpenTelemetry, off
    ssh: SSHOptions = field(default_factory=SSHOptions)  # workers on other hosts


Extension = Callable[["ControlPlane"], list[BaseRoute]]
"""Adds routes to the app, given the wired control plane (the admin UI is one). The CLI
passes them in: ``control_plane`` never imports ``web``."""


class ControlPlane:
    """Service + runtime + app, wired together."""

    def __init__(
        self,
        deployments: list[DeploymentSpec],
        options: ServerOptions,
        extensions: Sequence[Extension] = (),
    ) -> None:
        self.options = options
        self.tracing = Tracing.from_options(options.tracing)
        self.service = ServingService(
            ServingMetrics(),
            options.routing,
            options.disagg,
            options.reliability,
            options.tenant_defaults,
            self.tracing.tracer,
        )
        self.repo = Repository(make_engine(options.database_url or default_database_url()))
        self.recorder = ActorRecorder(self.repo)
        self.deployments = self._desired_state(deployments)
        self.api_keys = ApiKeys(self.repo.engine)
        self.key_guard = ApiKeyGuard(self.api_keys)
        self.runtime = ClusterRuntime(
            self.service,
            self.deployments,
            options.scheduler_address,
            options.n_workers,
            on_actor_event=self.recorder,
            gpu_placements=options.gpu_placements,
            worker_plugins=[p for p in (self.tracing.worker_plugin,) if p is not None],
            desired_state=lambda: asyncio.to_thread(stored_deployments, self.repo),
            on_lead=lambda: self.recorder.close_stale(self.options.who, STALE_ACTOR_REASON),
        )
        self.cluster_admin = ClusterAdmin(self.runtime)
        # Workers on other hosts (admin UI); the ones kept in the database start again
        # once the cluster is up.
        self.remote_workers = RemoteWorkers(self.cluster_admin, self.repo, options.ssh.settings())
        self.startup_error: BaseException | None = None
        self._all_ready: asyncio.Task[None] | None = None
        self._restoring: asyncio.Task[None] | None = None
        self.planner = (
            PlannerLoop(options.planner, self.runtime, self.repo) if options.planner else None
        )
        self.server: uvicorn.Server | None = None
        extra = [route for extend in extensions for route in extend(self)]
        guard = (
            [Middleware(RequireApiKey, guard=self.key_guard, metrics=self.service.metrics)]
            if options.require_api_key
            else []
        )
        if self.tracing.enabled:  # outside the key guard: a refused request is traced too
            guard.insert(0, Middleware(TraceRequests, tracer=self.tracing.tracer))
        self.app = build_app(
            self.service,
            self._lifespan,
            [*make_engines_routes(self.service, self.runtime.refresh_stats), *extra],
            middleware=guard,
            api_key_required=options.require_api_key,
            cors_allow_origins=options.cors_allow_origins,
            response_store=ResponseStore(self.repo.engine),
            chat_options=options.chat,
            readiness=self.runtime.readiness,
            leadership=self.runtime.leadership,
        )

    def _desired_state(self, deployments: list[DeploymentSpec]) -> list[DeploymentSpec]:
        """Migrates the database, stores ``deployments``, or restores them when empty.
        (The actor rows a killed leader left open are closed by the next leader.)"""
        upgrade(self.repo.engine)
        if deployments:
            store_deployments(self.repo, deployments, self.options.who)
            return deployments
        restored = stored_deployments(self.repo)
        if not restored:
            raise ValueError(
                "no deployments: pass -f deploy.yaml (see deploy/deploy.yaml); the database "
                "holds none to restore"
            )
        log.info("restored %d deployments from the database", len(restored))
        return restored

    @asynccontextmanager
    async def _lifespan(self, _: Starlette) -> AsyncIterator[None]:
        starting = asyncio.create_task(self.runtime.start(), name="runtime-start")
        starting.add_done_callback(self._started)
        stats = asyncio.create_task(self._refresh_stats_forever(), name="stats")
        try:
            yield
        finally:
            stats.cancel()
            starting.cancel()
            if self._all_ready is not None:
                self._all_ready.cancel()
            if self._restoring is not None:
                self._restoring.cancel()
            if self.planner is not None:
                self.planner.stop()
            await self.remote_workers.close()
            await self.runtime.stop()
            await asyncio.to_thread(self.recorder.close)
            await asyncio.to_thread(self.tracing.shutdown)

    def _started(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        if task.exception() is None:
            if self.server is not None:  # serving (not an app under test): see gc_policy
                settle_heap()  # the engines are up: what is alive now lives as long as we do
            if self.planner is not None:
                self.planner.start()
            self._announce_ready()
            self._all_ready = asyncio.create_task(self._announce_all_ready(), name="all-ready")
            self._restoring = asyncio.create_task(
                self.remote_workers.restore(), name="remote-workers-restore"
            )
            return
        self.startup_error = task.exception()
        print(f"dynask: error: the engines did not start: {self.startup_error}", file=sys.stderr)
        if self.server is not None:
            self.server.should_exit = True

    def _announce_ready(self) -> None:
        base = f"http://{self.options.host}:{self.options.port}"
        auth = '-H "authorization: Bearer $DYNASK_API_KEY" ' if self.options.require_api_key else ""
        for name, model in self.service.models.items():
            print(
                f"dynask: model '{name}' ready on {len(model.actors)} engine(s); try:\n"
                f"  curl {base}/v1/chat/completions {auth}-H 'content-type: application/json' "
                f'-d \'{{"model": "{name}", "messages": [{{"role": "user", '
                f'"content": "Hello!"}}]}}\'',
                file=sys.stderr,
            )

    async def _announce_all_ready(self) -> None:
        """Says once when every replica of every deployment is ready (``/ready`` is 200)."""
        while not all_ready(readiness := self.runtime.readiness()):
            await asyncio.sleep(ALL_READY_POLL_S)
        print(
            f"dynask: every deployment is up ({summary(readiness)}); /ready answers 200",
            file=sys.stderr,
        )

    def announce_keys(self) -> None:
        """Says whether /v1 needs a key, and how to make the first one."""
        if not self.options.require_api_key:
            return
        if self.api_keys.active_hashes():
            print("dynask: /v1 requires an API key (Authorization: Bearer KEY)", file=sys.stderr)
            return
        url = self.options.database_url or default_database_url()
        print(
            "dynask: /v1 requires an API key and none exists yet; create one with\n"
            f"  dynask keys create NAME --database-url '{url}'\n"
            "  (or on the admin UI's API keys page; start with --no-require-api-key to serve "
            "without keys)",
            file=sys.stderr,
        )

    async def _refresh_stats_forever(self) -> None:
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)
            try:
                await self.runtime.refresh_stats()
            except Exception as exc:  # an actor may be gone; the reconciler handles that
                log.debug("stats refresh failed: %s", exc)

    def serve(self) -> int:
        config = uvicorn.Config(
            self.app,
            host=self.options.host,
            port=self.options.port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=75,  # fewer requests lost to a race with keep-alive closes
        )
        self.server = uvicorn.Server(config)
        self.announce_keys()
        print(
            f"dynask: serving on http://{self.options.host}:{self.options.port} "
            "(OpenAI API under /v1; engines are loading)",
            file=sys.stderr,
        )
        self.server.run()
        return 1 if self.startup_error is not None else 0
