"""A whole serving stack in one event loop, for routing tests a user would recognise.

A real in-process Dask cluster with engine actors on it, a ``ServingService`` whose
handles read the actors' token streams, the Starlette app under a real uvicorn server on
a free port, and the official ``openai`` client (async) talking HTTP to it. Everything
shares the test's event loop, so a test can also reach into the service it talks to.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import uvicorn
from distributed import Client, LocalCluster
from opentelemetry.trace import Tracer
from starlette.middleware import Middleware

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.runtime.engine_actor import EngineActor
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.api.app import build_app
from dynask.control_plane.disagg.orchestrator import DisaggOptions
from dynask.control_plane.observability.http_tracing import TraceRequests
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.routing.model_routing import ModelRouting
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService
from tests.control_plane.server_process import free_port

MODEL = "mock"
BLOCK = 16
FAST_MOCKER = {"speedup_ratio": 0.0, "num_kv_blocks": 256}


@dataclass
class Stack:
    """What a routing test works with."""

    service: ServingService
    handles: list[ActorHandle]
    proxies: list[Any]
    openai: openai.AsyncOpenAI
    http: httpx.AsyncClient  # the same server, for non-OpenAI endpoints

    @property
    def routing(self) -> ModelRouting:
        return self.service.models[MODEL].routing

    def handle(self, name: str) -> ActorHandle:
        return next(h for h in self.handles if h.name == name)

    async def complete(self, prompt: list[int], max_tokens: int = 4, **extra: Any) -> Any:
        """A completion for token ids, EOS ignored; ``extra`` goes into the body."""
        return await self.openai.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=max_tokens,
            extra_body={"ignore_eos": True, **extra},
        )

    async def decisions(self, limit: int = 1) -> list[dict[str, Any]]:
        response = await self.http.get("/v1/routing/decisions", params={"limit": limit})
        response.raise_for_status()
        data: list[dict[str, Any]] = response.json()["data"]
        return data


def tokens(seed: int, blocks: int, extra: int = 0) -> list[int]:
    """``blocks`` full blocks of random token ids (plus ``extra`` tokens), fixed by ``seed``."""
    rng = random.Random(seed)
    return [rng.randrange(100, 40_000) for _ in range(blocks * BLOCK + extra)]


async def until(done: Any, what: str, timeout_s: float = 10.0) -> None:
    """Polls ``done()`` every 5 ms; fails naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def overlaps(decision: dict[str, Any]) -> dict[str, int]:
    return {c["actor"]: c["overlap_blocks"] for c in decision["candidates"]}


async def connect_service(
    proxies: Sequence[Any],
    routing: RoutingOptions | None = None,
    disagg: DisaggOptions | None = None,
    roles: Sequence[str] | None = None,
    reliability: ReliabilityOptions | None = None,
    tracer: Tracer | None = None,
) -> tuple[ServingService, list[ActorHandle]]:
    """A fresh control plane's view of running actors: a service, handles, synced index.
    ``roles`` (one per proxy) makes prefill/decode actors, which open a KV listener;
    ``tracer`` traces its requests (and the app's HTTP spans)."""
    service = ServingService(ServingMetrics(), routing, disagg, reliability, tracer=tracer)
    handles = []
    for proxy, role in zip(proxies, roles or ["aggregated"] * len(proxies), strict=True):
        # idempotent: a running actor answers with its info
        info = ActorInfo.from_dict(await proxy.start())
        if role != "aggregated":
            transport = service.disagg.options.transport
            info = info.with_kv_transfer(await proxy.open_kv_transfer(transport))
        handle = ActorHandle(name=info.name, deployment="d", proxy=proxy, info=info, role=role)
        await handle.connect()
        service.add_actor(MODEL, handle)
        handles.append(handle)
    await service.models[MODEL].routing.wait_synced()
    return service, handles


@asynccontextmanager
async def cluster_with_actors(
    model_folder: Path,
    count: int,
    engine: str = "mocker",
    engine_args: dict[str, Any] | None = None,
    worker_plugins: Sequence[Any] = (),
    actor_class: type[EngineActor] = EngineActor,
) -> AsyncIterator[list[Any]]:
    """An in-process cluster with ``count`` started actors (``mock-0`` ...); their proxies.
    ``worker_plugins`` are registered before the actors start (tracing's); ``actor_class``
    is a subclass to run instead (a newer release's actor). Inside, the cluster's client
    is ``distributed.default_client()``."""
    args = FAST_MOCKER if engine_args is None and engine == "mocker" else engine_args or {}
    spec = EngineSpec(kind=engine, model=str(model_folder), engine_args=args)
    async with (
        LocalCluster(
            n_workers=1, processes=False, asynchronous=True, dashboard_address=None
        ) as cluster,
        Client(cluster, asynchronous=True, direct_to_workers=True) as client,
    ):
        for plugin in worker_plugins:
            await client.register_plugin(plugin)
        proxies = [
            await client.submit(actor_class, spec, f"mock-{i}", actor=True, pure=False)
            for i in range(count)
        ]
        try:
            yield proxies
        finally:
            for proxy in proxies:
                await proxy.stop()


@asynccontextmanager
async def serving_stack(
    proxies: Sequence[Any],
    routing: RoutingOptions | None = None,
    disagg: DisaggOptions | None = None,
    roles: Sequence[str] | None = None,
    reliability: ReliabilityOptions | None = None,
    tracer: Tracer | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[Stack]:
    """A control plane over ``proxies``, served over HTTP on a free port; ``headers`` go
    with every request of the clients (a ``traceparent``)."""
    service, handles = await connect_service(proxies, routing, disagg, roles, reliability, tracer)
    port = free_port()
    middleware = [] if tracer is None else [Middleware(TraceRequests, tracer=tracer)]
    app = build_app(service, middleware=middleware)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    base = f"http://127.0.0.1:{port}"
    async with AsyncExitStack() as stack:  # closes in reverse: clients, server, handles
        for handle in handles:
            stack.push_async_callback(handle.close)
        stack.push_async_callback(_stop, server, serving)
        client = openai.AsyncOpenAI(
            base_url=f"{base}/v1", api_key="unused", max_retries=0, default_headers=headers
        )
        stack.push_async_callback(client.close)
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=base))
        yield Stack(service, handles, list(proxies), client, http)


async def _stop(server: uvicorn.Server, serving: asyncio.Task[None]) -> None:
    server.should_exit = True
    await serving
