"""``dynask run in=dyn://POOL out=ENGINE MODEL --scheduler tcp://HOST:8786``: this node
joins pool POOL of that cluster (``cluster.pools``).

It checks the engine and model here (a bad path fails before anything joins), registers
the pool's deployment on the scheduler if no node did, and starts ``--workers`` Dask
workers (nanny processes, one per GPU and pinned to it when the node has that many GPUs),
named ``dyn-POOL.HOST-PID-I`` so front ends (``out=dyn://POOL``) place the pool's engines
on them. It runs until Ctrl-C (or SIGTERM); then its workers leave and the front ends'
reconcilers drop their engines (requests in flight migrate to the pool's other nodes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from typing import Any

from dynask.control_plane.cli.engine_flags import engine_args
from dynask.control_plane.cluster import pools
from dynask.control_plane.cluster.plan import engine_spec, served_name
from dynask.control_plane.state.deployment import BUNDLED_MODEL, DeploymentSpec

NODE_DEATH_TIMEOUT_S = 60  # a worker whose scheduler is gone this long exits
NANNY_CLOSE_TIMEOUT_S = 2  # at exit: a worker still alive after ~0.8 x this is killed


def pool_node_command(args: argparse.Namespace) -> int:
    from dynask.actors.runtime.engine_factory import parse_engine, prepare_model

    pool = pools.pool_name(args.input)
    if args.scheduler is None:
        raise ValueError(
            f"in=dyn://{pool} joins a cluster: add --scheduler tcp://HOST:8786 "
            "(the scheduler's address)"
        )
    if args.engine.startswith(pools.SCHEME):
        raise ValueError(f"in=dyn://{pool} serves an engine: out=torch|vllm|echo|mocker|python:F")
    kind, python_file = parse_engine(args.engine)
    model = args.model or args.model_path
    prepare_model(model)
    spec = DeploymentSpec(
        name=pool,
        model=model or BUNDLED_MODEL,
        engine=kind,
        replicas=0,  # the front ends run one replica per pool worker
        engine_args=engine_args(args),
        served_model_name=args.model_name or served_name(model),
        engine_file=python_file,
    )
    engine_spec(spec)  # the engine factory's own checks, before joining
    return asyncio.run(_join(spec, args.scheduler, args.workers))


async def _join(spec: DeploymentSpec, scheduler: str, n_workers: int) -> int:
    from distributed import Client, Nanny

    from dynask.actors.runtime.gpu_discovery import discover_gpus

    async with Client(scheduler, asynchronous=True) as client:  # type: ignore[no-untyped-call]
        registered = await pools.register(client, spec)
    pin = len(discover_gpus()) >= n_workers  # one GPU per worker, when there are enough
    node = f"{socket.gethostname()}-{os.getpid()}"
    nannies: list[Any] = [
        Nanny(  # type: ignore[no-untyped-call]
            scheduler,
            nthreads=1,
            name=pools.worker_name(spec.name, f"{node}-{index}"),
            resources={"GPU": 1} if pin else None,
            env={"CUDA_VISIBLE_DEVICES": str(index)} if pin else {},
            death_timeout=NODE_DEATH_TIMEOUT_S,
        )
        for index in range(n_workers)
    ]
    await asyncio.gather(*nannies)  # started and registered with the scheduler
    names = ", ".join(n.name for n in nannies)
    print(
        f"dynask: this node joined pool '{spec.name}' ({registered.model}, engine "
        f"{registered.engine}) on {scheduler} as {names}; front ends serve it with: "
        f"dynask run in=http out=dyn://{spec.name} --scheduler {scheduler}",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        ended = [asyncio.ensure_future(n.finished()) for n in nannies]
        await asyncio.wait(
            [*ended, asyncio.ensure_future(stop.wait())], return_when="FIRST_COMPLETED"
        )
    finally:
        # The workers got the same Ctrl-C (one process group) and close themselves; one
        # that has not within NANNY_CLOSE_TIMEOUT_S is killed, so the node exits promptly.
        closing = (n.close(timeout=NANNY_CLOSE_TIMEOUT_S) for n in nannies)
        await asyncio.gather(*closing, return_exceptions=True)
    return 0
