"""The control plane that ``routing.py`` measures, in its own process.

Engine actors on a local Dask cluster of worker processes, several actors per worker
when asked (32 mocker actors on a 2-core machine would otherwise need 32 worker
processes), behind dynask's own ``ServingService``, Starlette app and uvicorn. The
serving path is the product's: actors, token streams with KV events, KV-aware routing,
the OpenAI API; only the placement differs from ``ClusterRuntime`` (which puts one
actor on each worker). The HTTP server starts once every actor is connected and its
prefix index synced, so ``/health`` answering 200 means all actors are ready.

Router replicas: each ``--port`` given after the first starts one more control plane in
front of the same actors (its own handles, routing and HTTP server), and each
``--unsynced-port`` one with ``--no-router-replica-sync``, so ``trace_replay.py`` can
compare one control plane with two that share their routings and two that do not, on
the same actors. They share this process's event loop: on a 2-core machine two processes
would compete for the same cores anyway.

    .venv/bin/python -m bench.routing.server --engine mocker --actors 32 --workers 4 \\
        --engine-args '{"speedup_ratio": 1.0}' --port 8123
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

import uvicorn
from distributed import Client, LocalCluster

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.runtime.engine_actor import EngineActor
from dynask.actors.runtime.engine_factory import EngineSpec, prepare_model
from dynask.control_plane.api.app import build_app
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.gc_policy import settle_heap
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService

MODEL = "bench"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="mocker", help="mocker | torch | echo")
    parser.add_argument("--engine-args", default="{}", help="JSON object of engine arguments")
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4, help="Dask worker processes")
    parser.add_argument(
        "--port", type=int, action="append", help="one control plane per port (default 8123)"
    )
    parser.add_argument(
        "--unsynced-port", type=int, action="append", default=[], help="--no-router-replica-sync"
    )
    parser.add_argument("--router-mode", default="kv", help="the default; requests override it")
    parser.add_argument("--kv-overlap-weight", type=float, default=None, help="w of the kv cost")
    parser.add_argument("--kv-decode-weight", type=float, default=None, help="decode block cost")
    parser.add_argument(
        "--kv-recompute-weight", type=float, default=None, help="uncached block cost"
    )
    args = parser.parse_args(argv)
    args.port = args.port or [8123]
    return args


async def start_actor(client: Client, spec: EngineSpec, name: str, worker: str) -> ActorHandle:
    proxy = await client.submit(
        EngineActor,
        spec,
        name,
        actor=True,
        workers=[worker],
        allow_other_workers=False,
        key=name,
        pure=False,
    )
    info = ActorInfo.from_dict(await proxy.start())
    handle = ActorHandle(name=name, deployment=MODEL, proxy=proxy, info=info)
    await handle.connect()
    return handle


async def start_actors(
    client: Client, spec: EngineSpec, names: list[str], worker: str
) -> list[ActorHandle]:
    return [await start_actor(client, spec, name, worker) for name in names]


async def serve(args: argparse.Namespace) -> None:
    spec = EngineSpec(kind=args.engine, engine_args=json.loads(args.engine_args))
    # The bundled GGUF is converted once, here, instead of by every actor at once.
    await asyncio.to_thread(prepare_model, spec.model)
    async with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            processes=True,
            asynchronous=True,
            dashboard_address=None,
        ) as cluster,
        Client(cluster, asynchronous=True, direct_to_workers=True) as client,
    ):
        identity = await client.scheduler.identity(n_workers=-1)  # type: ignore[union-attr]
        workers = sorted(identity["workers"])
        names = [f"{args.engine}-{i}" for i in range(args.actors)]
        placed = [names[w :: len(workers)] for w in range(len(workers))]
        # Workers in parallel, each worker's actors one by one: engines built at once in
        # one process race in transformers' lazy imports.
        started = await asyncio.gather(
            *(
                start_actors(client, spec, group, worker)
                for group, worker in zip(placed, workers, strict=True)
            )
        )
        handles = sorted((h for group in started for h in group), key=lambda h: names.index(h.name))
        weights = {
            name: value
            for name, value in (
                ("overlap_weight", args.kv_overlap_weight),
                ("decode_weight", args.kv_decode_weight),
                ("recompute_weight", args.kv_recompute_weight),
            )
            if value is not None  # None: the product's default
        }
        planes = [(port, True) for port in args.port] + [(p, False) for p in args.unsynced_port]
        services, every_handle = [], []
        for number, (_, synced) in enumerate(planes):
            own = handles if number == 0 else [await _reconnect(h) for h in handles]
            every_handle += own
            routing = RoutingOptions(mode=args.router_mode, replica_sync=synced, **weights)
            service = ServingService(ServingMetrics(), routing)
            for handle in own:
                service.add_actor(MODEL, handle)
            await service.models[MODEL].routing.wait_synced()
            services.append(service)
        print(
            f"{len(handles)} actors on {len(workers)} workers ready, "
            f"{len(planes)} control plane(s)",
            file=sys.stderr,
        )
        settle_heap()  # as ``dynask serve`` does once its engines are up
        servers = [
            uvicorn.Server(
                uvicorn.Config(
                    build_app(service),
                    host="127.0.0.1",
                    port=port,
                    log_level="warning",
                    timeout_keep_alive=75,
                )
            )
            for service, (port, _) in zip(services, planes, strict=True)
        ]
        # Until SIGTERM / SIGINT: the last server started catches it, stops, and raises it
        # again for the handler it replaced (the previous server's), and so on.
        try:
            await asyncio.gather(*(server.serve() for server in servers))
        finally:
            await _stop(handles, every_handle)


async def _reconnect(handle: ActorHandle) -> ActorHandle:
    """Another control plane's handle of the same actor: its own stream connection."""
    other = ActorHandle(name=handle.name, deployment=MODEL, proxy=handle.proxy, info=handle.info)
    await other.connect()
    return other


async def _stop(handles: list[ActorHandle], every_handle: list[ActorHandle]) -> None:
    for handle in every_handle:
        await handle.close()
    results: list[Any] = await asyncio.gather(
        *(asyncio.wait_for(h.proxy.stop(), 10) for h in handles), return_exceptions=True
    )
    for handle, result in zip(handles, results, strict=True):
        if isinstance(result, BaseException):
            print(f"stopping {handle.name} failed: {result}", file=sys.stderr)


if __name__ == "__main__":
    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(parse_args(sys.argv[1:])))
